/*
 * upload: the objects of started jobs, oldest job first. An object takes
 * an upload slot (--max-uploads) and its buffer (data + trailer) from the
 * budget (--buffer-mib) when it is queued; when either is used up, the rest
 * wait. A worker reads the object's bytes from the staging file, seals them
 * (block_seal) and, for file://, stores them; for s3://, it signs the PUT
 * and the loop runs it on the curl multi handle, driven by libevent as in
 * curl's docs/examples/hiperfifo.c (sock_cb / timer_cb / check_multi_info),
 * minus its exit() on errors: an error is the object's result.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "block.h"
#include "log.h"
#include "objstore_async.h"
#include "reconciler.h"
#include "slice.h"

struct obj_task {
	struct task t;
	struct rec *r;
	struct job *j;
	int fd;
	uint64_t obj;
	struct reconcile_object o;
	char key[SLICE_KEY_MAX];
	uint8_t *buf;
	size_t cap;
	struct objstore_aput *aput;
	bool seed;       /* write its seed (decided on the loop: seeds_wanted) */
	bool seeded;     /* its seed file was written: the job must know */
	char seed_tmp[RECONCILE_SEED_NAME_MAX];
	uint64_t t0_us, lat_us;
	int rc;
	char why[256];
	TAILQ_ENTRY(obj_task) curl_link;  /* on the multi handle */
};

static TAILQ_HEAD(, obj_task) on_curl = TAILQ_HEAD_INITIALIZER(on_curl);

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void obj_free(struct obj_task *ot)
{
	struct rec *r = ot->r;

	/* Whatever became of the put, the file is there: the job removes or
	 * hands it (a cancelled task's job outlives it too). */
	if (ot->seeded)
		ot->j->seeded |= (uint8_t)(1u << ot->obj);
	r->buffer_used -= ot->cap;
	r->uploads_in_flight--;
	objstore_aput_free(ot->aput);
	free(ot->buf);
	free(ot);
}

/* The object is stored or failed: tell its job, queue more. */
static void obj_finish(struct obj_task *ot)
{
	struct rec *r = ot->r;
	struct job *j = ot->j;
	uint64_t obj = ot->obj;
	int rc = ot->rc;
	char why[sizeof(ot->why)];

	if (rc == 0) {
		r->c.uploads_total++;
		r->c.upload_bytes_total += ot->o.size;
		metrics_upload_latency(r, ot->lat_us);
	}
	memcpy(why, ot->why, sizeof(why));
	obj_free(ot);
	jobs_object_done(r, j, obj, rc, why);
	upload_feed(r);
}

/* On a worker: read, seal, and store (file://) or sign (s3://). */
static void obj_run(struct task *t)
{
	struct obj_task *ot = (struct obj_task *)t;
	struct rec *r = ot->r;
	size_t got = 0;

	while (got < ot->o.size) {
		ssize_t n = pread(ot->fd, ot->buf + got, ot->o.size - got,
				  (off_t)(ot->o.file_off + got));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			ot->rc = -errno;
			snprintf(ot->why, sizeof(ot->why), "reading the staging file: %s",
				 strerror(errno));
			return;
		}
		if (n == 0) {
			ot->rc = -EIO;
			snprintf(ot->why, sizeof(ot->why),
				 "the staging file ends at %llu, before its length",
				 (unsigned long long)(ot->o.file_off + got));
			return;
		}
		got += (size_t)n;
	}
	size_t sealed = block_seal(ot->buf, ot->o.size);
	if (ot->seed)
		ot->seeded = seeds_write(r, ot->key, ot->seed_tmp, ot->buf, sealed);
	if (r->async_store) {
		ot->rc = objstore_aput_new(r->store, ot->key, ot->buf, sealed, &ot->aput);
	} else {
		uint64_t t0 = now_us();
		ot->rc = objstore_put(r->store, ot->key, ot->buf, sealed);
		ot->lat_us = now_us() - t0;
	}
	if (ot->rc < 0)
		snprintf(ot->why, sizeof(ot->why), "%s", objstore_last_error());
}

static void obj_done(struct task *t)
{
	struct obj_task *ot = (struct obj_task *)t;
	struct rec *r = ot->r;

	if (t->cancelled) {
		obj_free(ot);
		return;
	}
	if (ot->rc < 0 || !r->async_store) {
		obj_finish(ot);
		return;
	}
	CURL *e = objstore_aput_easy(ot->aput);
	curl_easy_setopt(e, CURLOPT_PRIVATE, ot);
	ot->t0_us = now_us();
	CURLMcode mc = curl_multi_add_handle(r->multi, e);
	if (mc != CURLM_OK) {
		ot->rc = -EIO;
		snprintf(ot->why, sizeof(ot->why), "curl: %s", curl_multi_strerror(mc));
		obj_finish(ot);
		return;
	}
	TAILQ_INSERT_TAIL(&on_curl, ot, curl_link);
}

void upload_feed(struct rec *r)
{
	while (!TAILQ_EMPTY(&r->feed) && r->uploads_in_flight < r->cfg.max_uploads) {
		struct job *j = TAILQ_FIRST(&r->feed);
		struct obj_task *ot;
		const struct meta_chunk_slice *cs;
		struct reconcile_object o;
		size_t cap;

		while (j->next_obj < j->plan.nobjects &&
		       (j->done[j->next_obj / 64] >> (j->next_obj % 64) & 1))
			j->next_obj++;
		if (j->next_obj >= j->plan.nobjects || j->err) {
			TAILQ_REMOVE(&r->feed, j, feed_link);
			j->feeding = false;
			continue;
		}
		if (reconcile_plan_object(&j->plan, j->next_obj, &o) < 0)
			break; /* cannot happen: next_obj < nobjects */
		cap = (size_t)o.size + BLOCK_TRAILER;
		/* Wait for room, unless nothing is in flight (a block larger than
		 * the whole budget must still go). */
		if (r->buffer_used && r->buffer_used + cap > r->cfg.buffer_bytes)
			break;
		ot = calloc(1, sizeof(*ot));
		if (ot)
			ot->buf = malloc(cap);
		if (!ot || !ot->buf) {
			free(ot);
			if (r->uploads_in_flight)
				break; /* memory comes back as uploads end */
			j->in_flight++;
			jobs_object_done(r, j, j->next_obj, -ENOMEM, "out of memory for a buffer");
			continue;
		}
		ot->t.run = obj_run;
		ot->t.done = obj_done;
		ot->r = r;
		ot->j = j;
		ot->fd = j->fd;
		ot->obj = j->next_obj;
		ot->o = o;
		ot->cap = cap;
		cs = &j->plan.slices[o.slice];
		slice_object_key(cs->s.id, o.index, cs->s.size, j->plan.block_size, ot->key,
				 sizeof(ot->key));
		ot->seed = seeds_wanted(r, j, j->next_obj, ot->key, ot->seed_tmp,
					sizeof(ot->seed_tmp));
		j->next_obj++;
		j->in_flight++;
		r->uploads_in_flight++;
		r->buffer_used += cap;
		work_submit(r, &ot->t);
	}
}

/* ---- libcurl multi under libevent ---- */

struct sock_info {
	curl_socket_t fd;
	struct event *ev;
};

static void check_multi_info(struct rec *r)
{
	CURLMsg *msg;
	int left;

	while ((msg = curl_multi_info_read(r->multi, &left))) {
		struct obj_task *ot = NULL;
		CURL *e;
		CURLcode res;
		int transient;

		if (msg->msg != CURLMSG_DONE)
			continue;
		/* msg is gone once the handle is removed: copy first. */
		e = msg->easy_handle;
		res = msg->data.result;
		curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&ot);
		curl_multi_remove_handle(r->multi, e);
		TAILQ_REMOVE(&on_curl, ot, curl_link);
		ot->lat_us = now_us() - ot->t0_us;
		ot->rc = objstore_aput_result(ot->aput, res, &transient);
		if (ot->rc < 0)
			snprintf(ot->why, sizeof(ot->why), "%s", objstore_last_error());
		objstore_aput_free(ot->aput);
		ot->aput = NULL;
		obj_finish(ot);
	}
}

static void curl_event_cb(evutil_socket_t fd, short kind, void *arg)
{
	struct rec *r = arg;
	int action = ((kind & EV_READ) ? CURL_CSELECT_IN : 0) |
		     ((kind & EV_WRITE) ? CURL_CSELECT_OUT : 0), running = 0;

	curl_multi_socket_action(r->multi, fd, action, &running);
	check_multi_info(r);
	if (running <= 0 && evtimer_pending(r->curl_timer, NULL))
		evtimer_del(r->curl_timer);
	rec_check_done(r);
}

static void curl_timer_cb(evutil_socket_t fd, short kind, void *arg)
{
	struct rec *r = arg;
	int running = 0;

	curl_multi_socket_action(r->multi, CURL_SOCKET_TIMEOUT, 0, &running);
	check_multi_info(r);
	rec_check_done(r);
}

/* curl wants a timeout: run curl_timer_cb after timeout_ms (never call
 * back into curl from here). */
static int multi_timer_cb(CURLM *multi, long timeout_ms, void *arg)
{
	struct rec *r = arg;
	struct timeval tv = { .tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000 };

	if (timeout_ms < 0)
		evtimer_del(r->curl_timer);
	else
		evtimer_add(r->curl_timer, &tv);
	return 0;
}

/* curl tells what to watch on one of its sockets. */
static int sock_cb(CURL *e, curl_socket_t s, int what, void *cbp, void *sockp)
{
	struct rec *r = cbp;
	struct sock_info *si = sockp;
	short kind;

	if (what == CURL_POLL_REMOVE) {
		if (si) {
			event_free(si->ev);
			free(si);
		}
		curl_multi_assign(r->multi, s, NULL);
		return 0;
	}
	kind = (short)(((what & CURL_POLL_IN) ? EV_READ : 0) |
		       ((what & CURL_POLL_OUT) ? EV_WRITE : 0) | EV_PERSIST);
	if (!si) {
		si = calloc(1, sizeof(*si));
		if (!si)
			return -1;
		si->fd = s;
		curl_multi_assign(r->multi, s, si);
	} else {
		event_free(si->ev);
	}
	si->ev = event_new(r->base, s, kind, curl_event_cb, r);
	if (!si->ev || event_add(si->ev, NULL) < 0)
		return -1;
	return 0;
}

int upload_init(struct rec *r)
{
	if (!r->async_store)
		return 0;
	r->multi = curl_multi_init();
	r->curl_timer = evtimer_new(r->base, curl_timer_cb, r);
	if (!r->multi || !r->curl_timer)
		return -ENOMEM;
	curl_multi_setopt(r->multi, CURLMOPT_SOCKETFUNCTION, sock_cb);
	curl_multi_setopt(r->multi, CURLMOPT_SOCKETDATA, r);
	curl_multi_setopt(r->multi, CURLMOPT_TIMERFUNCTION, multi_timer_cb);
	curl_multi_setopt(r->multi, CURLMOPT_TIMERDATA, r);
	curl_multi_setopt(r->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)r->cfg.max_uploads);
	return 0;
}

void upload_fini(struct rec *r)
{
	struct obj_task *ot;

	while ((ot = TAILQ_FIRST(&on_curl))) {
		TAILQ_REMOVE(&on_curl, ot, curl_link);
		curl_multi_remove_handle(r->multi, objstore_aput_easy(ot->aput));
		obj_free(ot);
	}
	if (r->multi)
		curl_multi_cleanup(r->multi); /* its sockets' CURL_POLL_REMOVE free sock_info */
	r->multi = NULL;
	if (r->curl_timer)
		event_free(r->curl_timer);
	r->curl_timer = NULL;
}
