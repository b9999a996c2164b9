/* ferry dump and ferry load: a volume's metadata out to a stream and a new
 * volume from one (meta_dump.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctl.h"
#include "dirs.h"
#include "meta.h"
#include "meta_dump.h"
#include "url.h"

int cmd_dump(int argc, char **argv)
{
	char *db = NULL, *dir = NULL, err[512] = "", tmp[PATH_MAX] = "";
	const char *file;
	FILE *out = NULL;
	uint64_t n = 0;
	int rc, code = 1;

	if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		printf("usage: ferry dump VOLUME [FILE]   (FILE - or none: standard output)\n");
		return 0;
	}
	if (argc < 2 || argc > 3) {
		ctl_err("dump takes a VOLUME and at most one FILE");
		return 2;
	}
	file = argc == 3 ? argv[2] : "-";
	if (meta_url_parse(argv[1], &db, &dir, err, sizeof(err)) < 0) {
		ctl_err("volume %s: %s", argv[1], err);
		goto out;
	}
	if (strcmp(file, "-") == 0) {
		out = stdout;
	} else {
		/* Written aside and renamed when whole: FILE is a complete dump or
		 * is not there. */
		int fd;

		if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", file, (int)getpid()) >= (int)sizeof(tmp)) {
			ctl_err("%s: name too long", file);
			goto out;
		}
		fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0 || !(out = fdopen(fd, "w"))) {
			ctl_err("cannot create %s: %s", tmp, strerror(errno));
			if (fd >= 0)
				close(fd);
			tmp[0] = '\0';
			goto out;
		}
	}
	rc = meta_dump(db, out, &n, err, sizeof(err));
	if (rc < 0) {
		ctl_err("cannot dump %s: %s", db, err);
		goto out;
	}
	if (out != stdout) {
		if (fflush(out) != 0 || fsync(fileno(out)) < 0) {
			ctl_err("cannot write %s: %s", tmp, strerror(errno));
			goto out;
		}
		if (rename(tmp, file) < 0) {
			ctl_err("cannot rename %s to %s: %s", tmp, file, strerror(errno));
			goto out;
		}
		tmp[0] = '\0';
	}
	fprintf(stderr, "ferry: dumped %llu records of %s to %s\n", (unsigned long long)n, db,
		out == stdout ? "standard output" : file);
	code = 0;
out:
	if (out && out != stdout)
		fclose(out);
	if (tmp[0])
		unlink(tmp);
	free(db);
	free(dir);
	return code;
}

int cmd_load(int argc, char **argv)
{
	char *db = NULL, *dir = NULL, err[512] = "";
	FILE *in = NULL;
	uint64_t n = 0;
	bool made_dir = false;
	int rc, code = 1;

	if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		printf("usage: ferry load FILE VOLUME   (FILE -: standard input)\n");
		return 0;
	}
	if (argc != 3) {
		ctl_err("load takes a dump FILE and a new VOLUME");
		return 2;
	}
	if (meta_url_parse(argv[2], &db, &dir, err, sizeof(err)) < 0) {
		ctl_err("volume %s: %s", argv[2], err);
		goto out;
	}
	in = strcmp(argv[1], "-") == 0 ? stdin : fopen(argv[1], "re");
	if (!in) {
		ctl_err("cannot open %s: %s", argv[1], strerror(errno));
		goto out;
	}
	made_dir = access(dir, F_OK) != 0;
	if ((rc = dirs_make(dir, 0755)) < 0) {
		ctl_err("cannot create %s: %s", dir, strerror(-rc));
		goto out;
	}
	rc = meta_load(in, db, &n, err, sizeof(err));
	if (rc < 0) {
		ctl_err("cannot load %s into %s: %s", argv[1], db, err);
		if (made_dir)
			(void)rmdir(dir); /* ours, and left empty by the failed load */
		goto out;
	}
	printf("loaded %llu records into %s; it names the same object store as the volume "
	       "dumped: mount one of the two, never both\n", (unsigned long long)n, db);
	code = 0;
out:
	if (in && in != stdin)
		fclose(in);
	free(db);
	free(dir);
	return code;
}
