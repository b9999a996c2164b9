#include "boot.h"
#include "dirs.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
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

/* A run as boot_run() writes it: 8 hex digits, '-', 1 to 10 digits. */
static bool is_run(const char *line)
{
	size_t n = strlen(line);

	if (n < BOOT_TAG_LEN + 2 || n > BOOT_RUN_LEN || line[BOOT_TAG_LEN] != '-')
		return false;
	for (size_t k = 0; k < n; k++) {
		if (k < BOOT_TAG_LEN ? !isxdigit((unsigned char)line[k])
				     : k > BOOT_TAG_LEN && !isdigit((unsigned char)line[k]))
			return false;
	}
	return true;
}

int boot_set_load(int dirfd, struct boot_set *s)
{
	char text[BOOT_SET_MAX * (BOOT_RUN_LEN + 1) + 2];
	int fd = openat(dirfd, BOOT_FLUSHED_NAME, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	size_t len = 0;
	int rc = 0;

	s->n = 0;
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	for (;;) {
		ssize_t got = read(fd, text + len, sizeof(text) - 1 - len);

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			rc = -errno;
			break;
		}
		if (got == 0)
			break;
		len += (size_t)got;
		if (len == sizeof(text) - 1) {
			rc = -EFBIG; /* more than a full set: not ours */
			break;
		}
	}
	close(fd);
	if (rc < 0)
		return rc;
	text[len] = '\0';
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		if (is_run(line))
			boot_set_add(s, line);
	}
	return 0;
}

int boot_set_store(int dirfd, const struct boot_set *s)
{
	char text[BOOT_SET_MAX * (BOOT_RUN_LEN + 1) + 1];
	size_t len = 0;

	for (size_t k = 0; k < s->n; k++)
		len += (size_t)snprintf(text + len, sizeof(text) - len, "%s\n", s->run[k]);
	return dirs_replace_file_at(dirfd, BOOT_FLUSHED_NAME, text, len);
}

bool boot_set_has(const struct boot_set *s, const char *run)
{
	for (size_t k = 0; k < s->n; k++) {
		if (strcmp(s->run[k], run) == 0)
			return true;
	}
	return false;
}

void boot_set_add(struct boot_set *s, const char *run)
{
	if (boot_set_has(s, run))
		return;
	if (s->n == BOOT_SET_MAX) {
		memmove(s->run[0], s->run[1], (BOOT_SET_MAX - 1) * sizeof(s->run[0]));
		s->n--;
	}
	snprintf(s->run[s->n++], sizeof(s->run[0]), "%s", run);
}

bool boot_set_remove(struct boot_set *s, const char *run)
{
	for (size_t k = 0; k < s->n; k++) {
		if (strcmp(s->run[k], run) == 0) {
			memmove(s->run[k], s->run[k + 1], (s->n - k - 1) * sizeof(s->run[0]));
			s->n--;
			return true;
		}
	}
	return false;
}

void boot_run(char *run, const char *tag, long pid)
{
	snprintf(run, BOOT_RUN_LEN + 1, "%.8s-%ld", tag, pid);
}

enum boot_name boot_name_state(const char *tag, const char *run, const char *now,
			       const struct boot_set *flushed)
{
	if (!tag)
		return BOOT_NAME_UNTAGGED;
	if (!now[0])
		return BOOT_NAME_UNKNOWN;
	if (strncmp(tag, now, BOOT_TAG_LEN) == 0)
		return BOOT_NAME_WHOLE;
	if (!flushed)
		return BOOT_NAME_UNKNOWN; /* the runs could not be read */
	return run && run[0] && boot_set_has(flushed, run) ? BOOT_NAME_WHOLE : BOOT_NAME_TORN;
}
