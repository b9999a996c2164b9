/* The .stats file: one "name value" line per figure, rendered at open. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "aws_creds.h"
#include "meta_names.h"
#include "mountd.h"

static const char *const op_names[OP_COUNT] = {
	[OP_LOOKUP] = "lookup", [OP_FORGET] = "forget", [OP_GETATTR] = "getattr",
	[OP_SETATTR] = "setattr", [OP_READLINK] = "readlink", [OP_MKNOD] = "mknod",
	[OP_MKDIR] = "mkdir", [OP_UNLINK] = "unlink", [OP_RMDIR] = "rmdir",
	[OP_SYMLINK] = "symlink", [OP_RENAME] = "rename", [OP_LINK] = "link",
	[OP_OPEN] = "open", [OP_READ] = "read", [OP_WRITE] = "write", [OP_FLUSH] = "flush",
	[OP_RELEASE] = "release", [OP_FSYNC] = "fsync", [OP_OPENDIR] = "opendir",
	[OP_READDIR] = "readdir", [OP_RELEASEDIR] = "releasedir", [OP_FSYNCDIR] = "fsyncdir",
	[OP_STATFS] = "statfs", [OP_SETXATTR] = "setxattr", [OP_GETXATTR] = "getxattr",
	[OP_LISTXATTR] = "listxattr", [OP_REMOVEXATTR] = "removexattr", [OP_ACCESS] = "access",
	[OP_CREATE] = "create", [OP_FALLOCATE] = "fallocate", [OP_READDIRPLUS] = "readdirplus",
	[OP_LSEEK] = "lseek", [OP_INTERRUPT_EINTR] = "interrupted",
};

const char *stats_op_name(enum op_id op)
{
	return op >= 0 && op < OP_COUNT ? op_names[op] : "unknown";
}

int stats_render(struct mountd *md, char **out, size_t *len)
{
	struct stats *st = &md->stats;
	char *buf = NULL;
	size_t size = 0;
	FILE *f = open_memstream(&buf, &size);
	uint64_t used_bytes = 0, used_inodes = 0;
	struct aws_creds_info ci;

	if (!f)
		return -errno;
	meta_statfs(md->meta, &used_bytes, &used_inodes);
	fprintf(f, "version %s\n", "0.1.0");
	fprintf(f, "pid %d\n", (int)getpid());
	fprintf(f, "uptime_seconds %lld\n",
		(long long)((mono_now_ns() - md->started_mono_ns) / 1000000000));
	fprintf(f, "volume_uuid %s\n", md->vol.uuid);
	fprintf(f, "storage %s\n", md->vol.storage_url);
	fprintf(f, "block_size %u\n", md->vol.block_size);
	fprintf(f, "used_bytes %llu\n", (unsigned long long)used_bytes);
	fprintf(f, "used_inodes %llu\n", (unsigned long long)used_inodes);
	struct meta_journal_stats js;
	meta_journal_stats_get(md->meta, &js);
	fprintf(f, "meta_batch_ms %d\n", md->meta_batch_ms);
	fprintf(f, "meta_journal_records %llu\n", (unsigned long long)js.records);
	fprintf(f, "meta_journal_pending %llu\n", (unsigned long long)js.pending);
	fprintf(f, "meta_batches %llu\n", (unsigned long long)js.batches);
	fprintf(f, "meta_journal_replayed %llu\n", (unsigned long long)js.replayed);
	fprintf(f, "meta_journal_replay_errors %llu\n", (unsigned long long)js.replay_errors);
	fprintf(f, "meta_inodes_released %llu\n", (unsigned long long)js.released);
	fprintf(f, "meta_inode_release_failures %llu\n", (unsigned long long)js.release_failures);
	fprintf(f, "meta_batch_changes_retried %llu\n", (unsigned long long)js.changes_retried);
	struct meta_names_stats ns;
	meta_names_stats(md->meta, &ns);
	fprintf(f, "names_dirs %llu\n", (unsigned long long)ns.dirs);
	fprintf(f, "names_counted %llu\n", (unsigned long long)ns.names);
	fprintf(f, "names_absent_answers %llu\n", (unsigned long long)ns.absent);
	fprintf(f, "names_resets %llu\n", (unsigned long long)ns.resets);
	fprintf(f, "names_scans %llu\n", (unsigned long long)ns.scans);
	/* The shared engine: the writer's lease and the connection. */
	if (objstore_creds_info(md->store, &ci) == 0) {
		/* Where the keys come from and how refreshing them goes; never a secret. */
		fprintf(f, "s3_credentials %s\n", ci.kind);
		fprintf(f, "s3_credentials_expire %lld\n", (long long)ci.expires);
		fprintf(f, "s3_credentials_refreshes %llu\n", (unsigned long long)ci.refreshes);
		fprintf(f, "s3_credentials_refresh_failures %llu\n",
			(unsigned long long)ci.refresh_failures);
	}
	{
		uint64_t rq, cn;

		if (objstore_conn_info(md->store, &rq, &cn) == 0)
			fprintf(f, "s3_requests %llu\ns3_connections_opened %llu\n",
				(unsigned long long)rq, (unsigned long long)cn);
	}
	fprintf(f, "follower %d\n", md->follower ? 1 : 0);
	fprintf(f, "lease_epoch %llu\n",
		md->follower ? 0ull : (unsigned long long)meta_lease_fenced_to(md->meta));
	fprintf(f, "lease_fenced %d\n", atomic_load(&md->lease_fenced) ? 1 : 0);
	fprintf(f, "lease_leftovers_kept %llu\n",
		(unsigned long long)atomic_load(&md->lease_leftovers));
	fprintf(f, "meta_up %d\n", !md->lease_held || atomic_load(&md->meta_up) ? 1 : 0);
	fprintf(f, "meta_reconnects %llu\n", (unsigned long long)meta_reconnects(md->meta));
	{
		uint64_t st, rt;

		meta_counters(md->meta, &st, &rt);
		fprintf(f, "meta_statements %llu\nmeta_round_trips %llu\n", (unsigned long long)st,
			(unsigned long long)rt);
	}
	fprintf(f, "meta_batch_commit_failures %llu\n", (unsigned long long)js.commit_failures);
	for (int i = 0; i < OP_COUNT; i++)
		fprintf(f, "fuse_requests_%s %llu\n", op_names[i],
			(unsigned long long)atomic_load(&st->requests[i]));
#define FIG(name) fprintf(f, #name " %llu\n", (unsigned long long)atomic_load(&st->name))
	FIG(bytes_read);
	FIG(bytes_written);
	FIG(objects_put);
	FIG(objects_get);
	FIG(bytes_uploaded);
	FIG(bytes_downloaded);
	FIG(cache_hits);
	FIG(cache_dropped);
	FIG(cache_seeded);
	FIG(uploads_drop_asked);
	FIG(cache_misses);
	FIG(commits);
	FIG(commit_failures);
	FIG(commit_invalidations);
	FIG(commit_invalidations_skipped);
	FIG(io_errors);
	FIG(passthrough_opens);
	FIG(backing_open);
	FIG(backing_close);
	FIG(blocks_unchanged);
	FIG(passthrough_no_room);
	FIG(staging_pool_hits);
	FIG(staging_pool_misses);
	FIG(staging_pool_failures);
	FIG(staging_pool_returns);
	FIG(copy_ups);
	FIG(copy_up_bytes);
	FIG(copy_ups_from_staging);
	FIG(local_copy_opens);
	FIG(local_copy_takeovers);
	FIG(local_copies_made);
	FIG(local_copies_dropped);
	FIG(local_copies_skipped);
	FIG(local_copies_handed_over);
	FIG(local_copies_restored);
	FIG(local_copies_built);
	FIG(local_copy_builds_given_up);
	FIG(staging_copies_set_aside);
	FIG(copy_up_too_big);
	FIG(copy_up_failures);
	FIG(writeback_bypassed);
	FIG(handoffs);
	FIG(handoff_failures);
	FIG(handoff_stalls);
	FIG(handoff_fd_scarce);
	FIG(reconciler_restarts);
	FIG(mapped_after_close);
	FIG(release_probes_deferred);
	FIG(reopen_waits);
	FIG(inflight_reads);
	FIG(spliced_reads);
	FIG(layout_hits);
	FIG(layout_misses);
	FIG(prefetch_queued);
	FIG(prefetch_fetched);
	FIG(prefetch_failed);
	FIG(prefetch_dropped);
	FIG(prefetch_cached);
	FIG(gc_rounds);
	FIG(staging_adopted);
	FIG(gc_objects_deleted);
	FIG(gc_bytes_freed);
#undef FIG
	{
		uint64_t gs = 0, gb = 0;

		/* Before the garbage: a freeing taken from this queue is in
		 * the batch, which the read below waits for. */
		fprintf(f, "meta_inodes_release_pending %llu\n",
			(unsigned long long)meta_releases_pending(md->meta));
		meta_gc_pending(md->meta, &gs, &gb);
		fprintf(f, "gc_pending_slices %llu\ngc_pending_bytes %llu\n", (unsigned long long)gs,
			(unsigned long long)gb);
	}
	{
		/* The reconciler's gauges, asked for now (a round trip). */
		struct reconcile_stats rs = { 0 };
		bool up = rclient_up(md) && rclient_stats(md, &rs) == 0;
		fprintf(f, "reconciler_up %d\n", up ? 1 : 0);
		fprintf(f, "reconcile_handed_inflight %llu\n",
			(unsigned long long)atomic_load(&md->rc_inflight));
		fprintf(f, "passthrough_staging_blocks %llu\n", (unsigned long long)rs.staging_blocks);
		fprintf(f, "passthrough_staging_bytes %llu\n", (unsigned long long)rs.staging_bytes);
		fprintf(f, "reconcile_inflight %llu\n", (unsigned long long)rs.inflight);
		fprintf(f, "reconcile_waiting %llu\n", (unsigned long long)rs.waiting);
		fprintf(f, "reconcile_failures_total %llu\n", (unsigned long long)rs.failures_total);
		fprintf(f, "reconcile_committed_total %llu\n", (unsigned long long)rs.committed_total);
		fprintf(f, "reconcile_dropped_total %llu\n", (unsigned long long)rs.dropped_total);
		fprintf(f, "reconcile_orphans %llu\n", (unsigned long long)rs.orphans);
		fprintf(f, "reconcile_uploads_total %llu\n", (unsigned long long)rs.uploads_total);
		fprintf(f, "reconcile_upload_bytes_total %llu\n",
			(unsigned long long)rs.upload_bytes_total);
		fprintf(f, "reconcile_upload_latency_us_avg %llu\n",
			(unsigned long long)(rs.upload_latency_count ?
					     rs.upload_latency_sum_us / rs.upload_latency_count : 0));
		fprintf(f, "reconcile_upload_latency_us_max %llu\n",
			(unsigned long long)rs.upload_latency_max_us);
	}
	fprintf(f, "passthrough_active %d\n", atomic_load(&md->pt_off) ? 0 : 1);
	fprintf(f, "writeback_cache %d\n", md->writeback ? 1 : 0);
	fprintf(f, "max_file_size %llu\n", (unsigned long long)md->max_file_size);
	fprintf(f, "fsync_local %d\n", md->fsync_local && rclient_up(md) ? 1 : 0);
	pthread_mutex_lock(&md->pt_reason_lock);
	fprintf(f, "passthrough_off_reason %s\n", atomic_load(&md->pt_off) ? md->pt_reason : "-");
	fprintf(f, "io_uring %d\n", atomic_load(&md->uring) ? 1 : 0);
	fprintf(f, "io_uring_off_reason %s\n", atomic_load(&md->uring) ? "-" :
		atomic_load(&md->uring_offered) ? "ring_not_serving" : md->ur_reason);
	pthread_mutex_unlock(&md->pt_reason_lock);
	fprintf(f, "io_uring_requests %llu\n",
		(unsigned long long)atomic_load(&md->stats.uring_requests));
	if (md->cfg.broker) {
		/* `ferry umount` reads these: a brokered mount is ended by us. */
		fprintf(f, "broker_socket %s\n", md->cfg.broker);
		fprintf(f, "broker_mount_id %llu\n",
			(unsigned long long)atomic_load(&md->broker_mount_id));
		fprintf(f, "broker_reattached %d\n", md->reattached ? 1 : 0);
		fprintf(f, "broker_up %d\n", atomic_load(&md->broker_up) ? 1 : 0);
		fprintf(f, "broker_relinks %llu\n",
			(unsigned long long)atomic_load(&st->broker_relinks));
	}
	fprintf(f, "cache_bytes %llu\n", (unsigned long long)read_cache_bytes(md->cache));
	fprintf(f, "prefetch_bytes %llu\n", (unsigned long long)prefetch_bytes(md->prefetch));
	fprintf(f, "prefetch_streams %u\n", prefetch_streams(md->prefetch));
	fprintf(f, "prefetch_streams_busy_max %u\n", prefetch_fetching_max(md->prefetch));
	pthread_mutex_lock(&md->kept_lock);
	uint64_t kept = md->kept_bytes;
	pthread_mutex_unlock(&md->kept_lock);
	fprintf(f, "local_copy_bytes %llu\n", (unsigned long long)kept);
	fprintf(f, "local_copy_limit %llu\n", (unsigned long long)md->local_copy_max);
	fprintf(f, "open_handles %llu\n", (unsigned long long)handle_count(md->handles) +
						     atomic_load(&st->releasing));
	fprintf(f, "inodes_cached %zu\n", inode_table_count(md->inodes));
	pthread_mutex_lock(&md->pending_lock);
	size_t npending = 0;
	for (struct inode *i = md->pending; i; i = i->pnext)
		npending++;
	pthread_mutex_unlock(&md->pending_lock);
	fprintf(f, "pending_commits %zu\n", npending);
	if (fclose(f) != 0) {
		free(buf);
		return -ENOMEM;
	}
	*out = buf;
	*len = size;
	return 0;
}
