/*
 * inval: the kernel cache invalidations a commit asks for, sent from a
 * thread of their own on a mount served over io_uring.
 *
 * fuse_lowlevel_notify_inval_inode() waits in the kernel for the pages of
 * the inode, which a READ of it in flight holds locked until it is
 * answered. Through /dev/fuse another worker answers that READ; on the
 * ring, the READ may wait behind a handler of the same CPU's queue that is
 * itself waiting for the reconciler reader thread (an open waiting for an
 * upload, a drain) — the thread that would be stuck in the notification.
 * So there the reader thread only queues the inode, and this thread sends.
 *
 * A local copy's build (copy_build.c) queues here too, on every mount: its
 * thread must stop before the mount goes, when a READ left unanswered
 * could hold it in the kernel for good, while this thread stops after the
 * unmount, which ends such a READ.
 *
 * Owned by struct mountd (md->inval, inval_start/inval_stop); the queue's
 * array is the thread's.
 */
#ifndef FERRY_MOUNTD_INVAL_H
#define FERRY_MOUNTD_INVAL_H

#include <stdint.h>

struct mountd;

/* Starts the thread: 0 or -errno. */
int inval_start(struct mountd *md);
/* Queues an invalidation of inode ino's cached pages and attributes. Never
 * blocks on the kernel. Without the thread (not started, or out of memory
 * for the queue) it is sent at once. */
void inval_inode(struct mountd *md, uint64_t ino);
/* Queues an invalidation of inode ino's cached pages and attributes for the
 * thread on every mount (a commit's, through inval_inode, is sent at once
 * through /dev/fuse); without the thread, sends nothing: a later open
 * drops the pages anyway. */
void inval_inode_later(struct mountd *md, uint64_t ino);
/* Has the kernel drop inode ino's cached attributes now, from any thread
 * (a request's handler too): a change it was not told of (set-id bits
 * cleared by a write) must not wait for a commit. */
void inval_attr(struct mountd *md, uint64_t ino);
/* Sends nothing more and ends the thread (what is queued is dropped: the
 * mount is gone by then). */
void inval_stop(struct mountd *md);

#endif
