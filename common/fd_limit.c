#include "fd_limit.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <sys/resource.h>

void fd_limit_raise(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
}

long fd_limit_soft(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY ||
	    rl.rlim_cur > (rlim_t)LONG_MAX)
		return -1;
	return (long)rl.rlim_cur;
}

long fd_limit_headroom(void)
{
	long limit = fd_limit_soft();
	struct dirent *de;
	long open_n = -1; /* the listing's own fd is not the caller's */
	DIR *d;

	if (limit < 0)
		return -1;
	d = opendir("/proc/self/fd");
	if (!d)
		return errno == EMFILE || errno == ENFILE ? 0 : -1;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			open_n++;
	closedir(d);
	return limit > open_n ? limit - open_n : 0;
}
