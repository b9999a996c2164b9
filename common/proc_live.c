#include "proc_live.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

bool proc_live(long pid)
{
	char path[64], buf[512], *rp;
	ssize_t n;
	int fd;

	if (pid <= 0 || (pid_t)pid != pid)
		return false;
	if (kill((pid_t)pid, 0) < 0 && errno != EPERM)
		return false;
	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return true; /* no /proc: kill() said it is there */
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return true;
	buf[n] = '\0';
	rp = strrchr(buf, ')'); /* the name may hold anything, ')' too */
	return !(rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X'));
}
