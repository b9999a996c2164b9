/*
 * metrics: the reconciler's figures, for Stats replies and as Prometheus
 * text at http://ADDR:PORT/metrics (libevent's evhttp, bound only to the
 * address given; every other path is 404).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "aws_creds.h"
#include "log.h"
#include "reconciler.h"

/* Upper bounds of the latency buckets, microseconds. */
static const uint64_t lat_le_us[REC_LAT_BUCKETS] = {
	5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000,
	30000000,
};

void metrics_upload_latency(struct rec *r, uint64_t us)
{
	size_t i = 0;

	while (i < REC_LAT_BUCKETS && us > lat_le_us[i])
		i++;
	r->c.lat_bucket[i]++;
	r->c.lat_count++;
	r->c.lat_sum_us += us;
	if (us > r->c.lat_max_us)
		r->c.lat_max_us = us;
}

void metrics_snapshot(struct rec *r, struct reconcile_stats *s)
{
	memset(s, 0, sizeof(*s));
	s->staging_blocks = r->c.staging_blocks;
	s->staging_bytes = r->c.staging_bytes;
	s->inflight = r->njobs;
	s->failures_total = r->c.failures_total;
	s->uploads_total = r->c.uploads_total;
	s->upload_latency_count = r->c.lat_count;
	s->upload_latency_sum_us = r->c.lat_sum_us;
	s->upload_latency_max_us = r->c.lat_max_us;
	s->orphans = r->c.orphans;
	s->committed_total = r->c.committed_total;
	s->dropped_total = r->c.dropped_total;
	s->upload_bytes_total = r->c.upload_bytes_total;
	s->buffer_bytes = r->buffer_used;
	s->waiting = r->nready;
}

static void metric(struct evbuffer *b, const char *name, const char *type, const char *help,
		   uint64_t v)
{
	evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", name, help, name,
			    type, name, v);
}

static void http_cb(struct evhttp_request *req, void *arg)
{
	struct rec *r = arg;
	const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
	const char *path = u ? evhttp_uri_get_path(u) : NULL;
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	struct evbuffer *b;
	struct reconcile_stats s;
	struct aws_creds_info ci;
	uint64_t cum = 0;

	if (!path || strcmp(path, "/metrics") != 0) {
		evhttp_send_error(req, HTTP_NOTFOUND, NULL);
		return;
	}
	if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
		evhttp_send_error(req, HTTP_BADMETHOD, NULL);
		return;
	}
	b = evbuffer_new();
	if (!b) {
		evhttp_send_error(req, HTTP_INTERNAL, NULL);
		return;
	}
	metrics_snapshot(r, &s);
	metric(b, "passthrough_staging_blocks", "gauge",
	       "4 MiB blocks handed over to the reconciler and not yet committed", s.staging_blocks);
	metric(b, "passthrough_staging_bytes", "gauge",
	       "Bytes handed over to the reconciler and not yet committed", s.staging_bytes);
	metric(b, "reconcile_inflight", "gauge", "Jobs handed over and not finished", s.inflight);
	metric(b, "reconcile_waiting", "gauge",
	       "Jobs not started yet: a burst of handoffs goes on, or no start slot is free",
	       s.waiting);
	metric(b, "reconcile_failures_total", "counter", "Failed job attempts", s.failures_total);
	metric(b, "reconcile_orphans", "gauge",
	       "Jobs given up this run, kept as .orphan until the next start", s.orphans);
	metric(b, "reconcile_committed_total", "counter", "Jobs committed", s.committed_total);
	metric(b, "reconcile_dropped_total", "counter",
	       "Jobs dropped before their upload began: their file was deleted", s.dropped_total);
	metric(b, "uploads_total", "counter", "Objects stored", s.uploads_total);
	metric(b, "upload_bytes_total", "counter", "Data bytes stored", s.upload_bytes_total);
	metric(b, "upload_buffer_bytes", "gauge", "Memory in upload buffers", s.buffer_bytes);
	if (objstore_creds_info(r->store, &ci) == 0) {
		/* The keys the uploads are signed with: a refresh that keeps failing
		 * shows here before the uploads start failing. */
		evbuffer_add_printf(b, "# HELP s3_credentials_info Where the S3 keys come from\n"
				       "# TYPE s3_credentials_info gauge\ns3_credentials_info{source=\"%s\"} 1\n",
				    ci.kind);
		metric(b, "s3_credentials_expire_timestamp_seconds", "gauge",
		       "When the S3 key in use expires, Unix seconds (0: never)",
		       ci.expires > 0 ? (uint64_t)ci.expires : 0);
		metric(b, "s3_credentials_refreshes_total", "counter", "S3 keys fetched after the first",
		       ci.refreshes);
		metric(b, "s3_credentials_refresh_failures_total", "counter",
		       "Fetches of a new S3 key that failed", ci.refresh_failures);
	}
	evbuffer_add_printf(b, "# HELP upload_latency_seconds Time to store one object\n"
			       "# TYPE upload_latency_seconds histogram\n");
	for (size_t i = 0; i <= REC_LAT_BUCKETS; i++) {
		cum += r->c.lat_bucket[i];
		if (i < REC_LAT_BUCKETS)
			evbuffer_add_printf(b, "upload_latency_seconds_bucket{le=\"%g\"} %" PRIu64 "\n",
					    (double)lat_le_us[i] / 1e6, cum);
		else
			evbuffer_add_printf(b, "upload_latency_seconds_bucket{le=\"+Inf\"} %" PRIu64
					    "\n", cum);
	}
	evbuffer_add_printf(b, "upload_latency_seconds_sum %.6f\nupload_latency_seconds_count %"
			    PRIu64 "\n", (double)r->c.lat_sum_us / 1e6, r->c.lat_count);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
			  "text/plain; version=0.0.4");
	evhttp_send_reply(req, HTTP_OK, "OK", b);
	evbuffer_free(b);
}

int metrics_start(struct rec *r)
{
	struct evhttp_bound_socket *h;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	int port = r->cfg.metrics_port;

	if (!r->cfg.metrics_addr)
		return 0;
	r->http = evhttp_new(r->base);
	if (!r->http)
		return -ENOMEM;
	evhttp_set_allowed_methods(r->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
	evhttp_set_gencb(r->http, http_cb, r);
	evhttp_set_timeout(r->http, 10);
	h = evhttp_bind_socket_with_handle(r->http, r->cfg.metrics_addr, (ev_uint16_t)port);
	if (!h)
		return errno ? -errno : -EADDRINUSE;
	if (getsockname(evhttp_bound_socket_get_fd(h), (struct sockaddr *)&ss, &sl) == 0) {
		if (ss.ss_family == AF_INET)
			port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
		else if (ss.ss_family == AF_INET6)
			port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	}
	log_info("metrics at http://%s%s%s:%d/metrics", strchr(r->cfg.metrics_addr, ':') ? "[" : "",
		 r->cfg.metrics_addr, strchr(r->cfg.metrics_addr, ':') ? "]" : "", port);
	return 0;
}

void metrics_stop(struct rec *r)
{
	if (r->http)
		evhttp_free(r->http);
	r->http = NULL;
}
