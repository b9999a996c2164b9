/*
 * ferry: the user's command-line tool. One file per command group; each
 * command is `int cmd_X(int argc, char **argv)` returning the exit code and
 * printing one clear line on stderr when it fails.
 */
#ifndef FERRY_CTL_H
#define FERRY_CTL_H

#include <stddef.h>

int cmd_format(int argc, char **argv);   /* format.c */
int cmd_mount(int argc, char **argv);    /* mount.c */
int cmd_umount(int argc, char **argv);   /* mount.c */
int cmd_status(int argc, char **argv);   /* status.c */
int cmd_warmup(int argc, char **argv);   /* warmup.c */
int cmd_drain(int argc, char **argv);    /* drain.c */
int cmd_dump(int argc, char **argv);     /* dump.c */
int cmd_load(int argc, char **argv);     /* dump.c */
int cmd_checkpoint(int argc, char **argv); /* checkpoint.c */
int cmd_restore(int argc, char **argv);  /* checkpoint.c */
int cmd_gc(int argc, char **argv);       /* checkpoint.c */

/* drain.c: a drain (checkpoint NULL) or a checkpoint through MOUNTPOINT's
 * .control file, shown as ferry drain shows it; the exit code. */
int ctl_control_run(const char *mountpoint, const char *checkpoint, double timeout_s, int json);
/* --timeout's seconds (0: none) into *seconds; -EINVAL, said for cmd. */
int ctl_timeout_arg(const char *cmd, const char *arg, double *seconds);

/* main.c */
void ctl_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The directory holding this program (and its sibling daemons); static. */
const char *ctl_bindir(void);
/* Reads MOUNTPOINT/.stats into a malloc'ed NUL-terminated buffer. */
int ctl_read_stats(const char *mountpoint, char **out);
/* ctl_read_stats() in a child process, given up (and the child killed)
 * after timeout_ms (<= 0: no limit): -ETIMEDOUT when the daemon does not
 * answer, as a wedged one does not. */
int ctl_read_stats_within(const char *mountpoint, int timeout_ms, char **out);
/* Value of "name value" line in a .stats text, copied into buf. */
int ctl_stats_value(const char *stats, const char *name, char *buf, size_t len);

#endif
