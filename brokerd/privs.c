/*
 * privs: what ferry-brokerd keeps of root, and the switch to a peer's
 * file-system identity.
 *
 * Kept: CAP_SYS_ADMIN, effective (mounts, the backing ioctls);
 * CAP_SETUID and CAP_SETGID, permitted only: setfsuid()/setfsgid() to
 * another id need them, so they are raised around each switch and lowered
 * again before anything else runs. Everything else goes, from the bounding
 * set too; ambient and inheritable sets are emptied, supplementary groups
 * cleared for good (so every switch runs with no groups), no_new_privs set.
 *
 * The switch: privs_become() makes fsuid/fsgid the peer's (with CAP_SETUID
 * and CAP_SETGID raised until privs_restore()); the path resolution of a
 * peer's target and the FUSE_DEV_IOC_BACKING_OPEN ioctl run that way, so the
 * kernel records the peer's credentials for the backing file
 * (fs/fuse/passthrough.c keeps them for every passthrough I/O).
 * Supplementary groups were cleared at start, so there are none to switch.
 * privs_restore() goes back; if that cannot be verified the process exits:
 * it can no longer trust what it does.
 */
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/fsuid.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "brokerd.h"
#include "log.h"

static const cap_value_t keep_eff[] = { CAP_SYS_ADMIN };
static const cap_value_t keep_prm[] = { CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID };

static cap_t caps_lowered; /* effective: SYS_ADMIN */
static cap_t caps_raised;  /* effective: SYS_ADMIN, SETUID, SETGID */
static uid_t base_fsuid;
static gid_t base_fsgid;

static bool kept(cap_value_t c)
{
	for (size_t i = 0; i < sizeof(keep_prm) / sizeof(keep_prm[0]); i++)
		if (keep_prm[i] == c)
			return true;
	return false;
}

static cap_t caps_make(bool raised)
{
	cap_t c = cap_init(); /* all clear */

	if (!c)
		return NULL;
	if (cap_set_flag(c, CAP_PERMITTED, 3, keep_prm, CAP_SET) < 0 ||
	    cap_set_flag(c, CAP_EFFECTIVE, raised ? 3 : 1, raised ? keep_prm : keep_eff,
			 CAP_SET) < 0) {
		cap_free(c);
		return NULL;
	}
	return c;
}

void privs_close_stray_fds(void)
{
	/* Only stdin, stdout and stderr may come with us: an fd inherited
	 * from whoever started us could be anything, even a FUSE file. */
	close_range(3, ~0u, 0);
}

int privs_check(char *err, size_t errlen)
{
	cap_t cur = cap_get_proc();
	cap_flag_value_t v;
	int rc = 0;

	if (!cur) {
		rc = -errno;
		snprintf(err, errlen, "cannot read the process capabilities: %s", strerror(-rc));
		return rc;
	}
	for (size_t i = 0; i < sizeof(keep_prm) / sizeof(keep_prm[0]); i++) {
		if (cap_get_flag(cur, keep_prm[i], CAP_PERMITTED, &v) < 0 || v != CAP_SET) {
			char *name = cap_to_name(keep_prm[i]);
			snprintf(err, errlen, "ferry-brokerd needs %s (it keeps CAP_SYS_ADMIN, and "
				 "CAP_SETUID/CAP_SETGID to act with a peer's fsuid): run it as root "
				 "or grant it these capabilities", name ? name : "a capability");
			cap_free(name);
			rc = -EPERM;
			break;
		}
	}
	cap_free(cur);
	return rc;
}

int privs_drop(char *err, size_t errlen)
{
	cap_t cur;
	int rc = privs_check(err, errlen);

	if (rc < 0)
		return rc;
	cur = cap_get_proc();
	if (!cur) {
		rc = -errno;
		snprintf(err, errlen, "cannot read the process capabilities: %s", strerror(-rc));
		return rc;
	}
	/* Raise what we have permitted, for the steps below. */
	if (cap_fill(cur, CAP_EFFECTIVE, CAP_PERMITTED) < 0 || cap_set_proc(cur) < 0) {
		rc = -errno;
		snprintf(err, errlen, "cannot raise the permitted capabilities: %s", strerror(-rc));
		goto out;
	}
	if (setgroups(0, NULL) < 0) {
		rc = -errno;
		snprintf(err, errlen, "cannot clear the supplementary groups: %s", strerror(-rc));
		goto out;
	}
	for (cap_value_t c = 0; c < (cap_value_t)cap_max_bits(); c++) {
		if (kept(c) || cap_get_bound(c) <= 0)
			continue;
		if (cap_drop_bound(c) < 0) {
			char *name = cap_to_name(c);
			rc = -errno;
			snprintf(err, errlen, "cannot drop %s from the bounding set (CAP_SETPCAP "
				 "needed): %s", name ? name : "?", strerror(-rc));
			cap_free(name);
			goto out;
		}
	}
	if (cap_reset_ambient() < 0 && errno != EINVAL) {
		rc = -errno;
		snprintf(err, errlen, "cannot clear the ambient capabilities: %s", strerror(-rc));
		goto out;
	}
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
		rc = -errno;
		snprintf(err, errlen, "cannot set no_new_privs: %s", strerror(-rc));
		goto out;
	}
	caps_lowered = caps_make(false);
	caps_raised = caps_make(true);
	if (!caps_lowered || !caps_raised || cap_set_proc(caps_lowered) < 0) {
		rc = errno ? -errno : -ENOMEM;
		snprintf(err, errlen, "cannot set the capabilities: %s", strerror(-rc));
		goto out;
	}
	base_fsuid = (uid_t)setfsuid((uid_t)-1);
	base_fsgid = (gid_t)setfsgid((gid_t)-1);
out:
	cap_free(cur);
	return rc;
}

/*
 * Each credential change costs a prepare_creds()/commit_creds() (1-2 us
 * here), and BACKING_OPEN does a switch and a restore: so CAP_SETUID and
 * CAP_SETGID are raised once for the switch and lowered once after the
 * restore. The credentials the kernel records for a backing file thus carry
 * them as effective too; they play no part in read/write/mmap of that file.
 */
int privs_become(uid_t uid, gid_t gid)
{
	if (!caps_raised)
		return -EPERM; /* privs_drop() did not run: nothing to switch with */
	if (cap_set_proc(caps_raised) < 0)
		return -errno;
	setfsgid(gid);
	if ((gid_t)setfsgid((gid_t)-1) == gid) {
		setfsuid(uid);
		if ((uid_t)setfsuid((uid_t)-1) == uid)
			return 0;
	}
	privs_restore();
	return -EPERM;
}

void privs_restore(void)
{
	if (!caps_raised)
		return;
	setfsuid(base_fsuid);
	setfsgid(base_fsgid);
	if ((uid_t)setfsuid((uid_t)-1) != base_fsuid || (gid_t)setfsgid((gid_t)-1) != base_fsgid ||
	    getgroups(0, NULL) != 0)
		fatalx("cannot restore fsuid %d / fsgid %d: exiting rather than acting with "
		       "another identity", (int)base_fsuid, (int)base_fsgid);
	if (cap_set_proc(caps_lowered) < 0)
		fatal("cannot lower CAP_SETUID/CAP_SETGID again");
}

void privs_fini(void)
{
	cap_free(caps_lowered);
	cap_free(caps_raised);
	caps_lowered = caps_raised = NULL;
}

void privs_describe(char *buf, size_t len)
{
	cap_t cur = cap_get_proc();
	char *t = cur ? cap_to_text(cur, NULL) : NULL;

	snprintf(buf, len, "%s", t ? t : "?");
	cap_free(t);
	cap_free(cur);
}
