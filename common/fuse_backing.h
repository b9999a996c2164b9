/*
 * fuse_backing: the kernel's FUSE passthrough ioctls on a /dev/fuse fd
 * (include/uapi/linux/fuse.h, Linux >= 6.9), which Debian 12's headers
 * predate. Used by ferry-mountd (registering its own staging files, with
 * CAP_SYS_ADMIN) and ferry-brokerd (registering them for a peer).
 */
#ifndef FERRY_FUSE_BACKING_H
#define FERRY_FUSE_BACKING_H

#include <stdint.h>
#include <sys/ioctl.h>

struct ferry_backing_map {
	int32_t fd;
	uint32_t flags;
	uint64_t padding;
};

#define FERRY_DEV_IOC_MAGIC 229
/* Returns the new backing id (> 0). */
#define FERRY_DEV_IOC_BACKING_OPEN _IOW(FERRY_DEV_IOC_MAGIC, 1, struct ferry_backing_map)
/* Takes the id as a uint32_t. */
#define FERRY_DEV_IOC_BACKING_CLOSE _IOW(FERRY_DEV_IOC_MAGIC, 2, uint32_t)

#endif
