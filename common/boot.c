#include "boot.h"

#include <ctype.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#define BOOT_ID_PATH "/proc/sys/kernel/random/boot_id"

void boot_id(char *buf, size_t len)
{
	int fd = open(BOOT_ID_PATH, O_RDONLY | O_CLOEXEC);
	ssize_t n = -1;

	if (len == 0)
		return;
	buf[0] = '\0';
	if (fd < 0)
		return;
	n = read(fd, buf, len - 1);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
}

bool boot_tag(char tag[BOOT_TAG_LEN + 1])
{
	char id[64];
	size_t k = 0;

	boot_id(id, sizeof(id));
	for (const char *p = id; *p && k < BOOT_TAG_LEN; p++) {
		if (isxdigit((unsigned char)*p))
			tag[k++] = (char)tolower((unsigned char)*p);
	}
	tag[k == BOOT_TAG_LEN ? k : 0] = '\0';
	return k == BOOT_TAG_LEN;
}

const char *boot_tag_of_name(const char *name, const char *mark)
{
	size_t n = strlen(name), k = strlen(mark);
	const char *at;

	if (n < k + BOOT_TAG_LEN)
		return NULL;
	at = name + n - BOOT_TAG_LEN - k;
	if (strncmp(at, mark, k) != 0)
		return NULL;
	for (const char *p = at + k; *p; p++) {
		if (!isxdigit((unsigned char)*p))
			return NULL;
	}
	return at + k;
}

bool boot_name_of_other_boot(const char *name, const char *mark)
{
	const char *tag = boot_tag_of_name(name, mark);
	char now[BOOT_TAG_LEN + 1];

	return tag && (!boot_tag(now) || strcmp(tag, now) != 0);
}
