/*
 * aws_creds: the provider (aws_creds.h): the current key, reference-counted,
 * and the thread that replaces it ahead of its expiry. One fetch at a time:
 * a caller that needs a key while a fetch runs waits for that fetch.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "aws_creds.h"
#include "aws_source.h"

#define REFRESH_AHEAD_MAX_S 300  /* the SDKs' 5 minutes */
#define BACKOFF_FIRST_S 1
#define BACKOFF_MAX_S 30
#define EXPIRY_MARGIN_S 2        /* a key this close to its end is not handed out */

struct key_ref {
	struct aws_key k;       /* first: aws_key_put() casts back */
	atomic_int refs;
	struct aws_fields f;    /* owns the strings k points at */
};

struct aws_creds {
	pthread_mutex_t mu;
	pthread_cond_t cv;      /* a fetch ended, or the thread is asked to stop or to hurry */
	struct aws_source *src;
	struct key_ref *cur;
	int64_t fetched_at;     /* when cur was fetched (Unix s) */
	int64_t next_try;       /* after a failed refresh: not before (Unix s) */
	int backoff_s;
	int fetching;
	int hurry;              /* aws_creds_refresh() asked for a fetch now */
	int stop;
	atomic_int closing;     /* the source's fetches give up (aws_source_set_abort) */
	int has_thread;
	pthread_t thread;
	uint64_t refreshes, failures;
	char last_error[256];
	int failing;            /* the last refresh failed (for report) */
	int last_ret;           /* the last fetch's errno, 0 if it worked */
	void (*report)(void *arg, const char *msg);
	void *report_arg;
};

static int64_t
now_s(void)
{
	return (int64_t)time(NULL);
}

static void
key_free(struct key_ref *r)
{
	aws_fields_clear(&r->f);
	free(r);
}

void
aws_key_put(const struct aws_key *k)
{
	struct key_ref *r = (struct key_ref *)k;

	if (r && atomic_fetch_sub(&r->refs, 1) == 1)
		key_free(r);
}

/* When the key should be replaced: min(5 min, half its lifetime) before it expires. */
static int64_t
refresh_at(const struct aws_creds *c)
{
	int64_t life = c->cur->k.expires - c->fetched_at, ahead = life / 2;

	if (ahead > REFRESH_AHEAD_MAX_S)
		ahead = REFRESH_AHEAD_MAX_S;
	return c->cur->k.expires - ahead;
}

/*
 * One fetch, with mu held on entry and on return (dropped meanwhile; the
 * fetching flag keeps it to one at a time). 0 or the fetch's errno.
 */
static int
fetch_locked(struct aws_creds *c)
{
	struct aws_fields f = { 0 };
	struct key_ref *r = NULL, *old;
	char err[256] = "";
	int64_t t = now_s();
	int ret;

	c->fetching = 1;
	pthread_mutex_unlock(&c->mu);
	ret = aws_source_fetch(c->src, &f, err, sizeof(err));
	if (ret == 0 && f.expires != 0 && f.expires <= now_s() + EXPIRY_MARGIN_S) {
		snprintf(err, sizeof(err), "%s: the credentials it gave expire at once",
			 aws_source_name(c->src));
		aws_fields_clear(&f);
		ret = -EIO;
	}
	if (ret == 0) {
		r = calloc(1, sizeof(*r));
		if (r == NULL) {
			aws_fields_clear(&f);
			snprintf(err, sizeof(err), "out of memory");
			ret = -ENOMEM;
		}
	}
	pthread_mutex_lock(&c->mu);
	c->fetching = 0;
	c->last_ret = ret;
	if (ret == 0) {
		r->f = f;
		r->k.access_key = f.access_key;
		r->k.secret_key = f.secret_key;
		r->k.session_token = f.session_token;
		r->k.expires = f.expires;
		r->k.generation = c->cur ? c->cur->k.generation + 1 : 1;
		atomic_init(&r->refs, 1);
		old = c->cur;
		c->cur = r;
		c->fetched_at = t;
		c->backoff_s = 0;
		c->next_try = 0;
		if (old) {
			c->refreshes++;
			aws_key_put(&old->k);
		}
	} else {
		if (!err[0])
			snprintf(err, sizeof(err), "%s: %s", aws_source_name(c->src), strerror(-ret));
		snprintf(c->last_error, sizeof(c->last_error), "%s", err);
		if (c->cur)
			c->failures++;
		c->backoff_s = c->backoff_s ? c->backoff_s * 2 : BACKOFF_FIRST_S;
		if (c->backoff_s > BACKOFF_MAX_S)
			c->backoff_s = BACKOFF_MAX_S;
		c->next_try = now_s() + c->backoff_s;
	}
	pthread_cond_broadcast(&c->cv);
	return ret;
}

/* Tells the daemon of a failed refresh, and of the first good one after. mu held on entry
 * and return, dropped for the call. */
static void
report_fetch(struct aws_creds *c, int ret)
{
	char msg[512];

	if (c->report == NULL || (ret == 0 && !c->failing))
		return;
	if (ret == 0)
		snprintf(msg, sizeof(msg), "s3 credentials: %s answers again; the new key expires in "
			 "%lld s", aws_source_name(c->src), (long long)(c->cur->k.expires - now_s()));
	else
		snprintf(msg, sizeof(msg), "s3 credentials: refresh failed (%.200s); trying again in "
			 "%d s; the key in use expires in %lld s", c->last_error, c->backoff_s,
			 (long long)(c->cur->k.expires - now_s()));
	c->failing = ret != 0;
	/* Not under mu: the daemon's logging may block on its log file. */
	pthread_mutex_unlock(&c->mu);
	c->report(c->report_arg, msg);
	pthread_mutex_lock(&c->mu);
}

static void *
refresh_main(void *arg)
{
	struct aws_creds *c = arg;

	pthread_mutex_lock(&c->mu);
	while (!c->stop) {
		int64_t due = c->cur->k.expires ? refresh_at(c) : INT64_MAX, t = now_s();

		if (c->next_try > due)
			due = c->next_try;
		if (c->hurry || (t >= due && !c->fetching)) {
			c->hurry = 0;
			if (!c->fetching) {
				int r = fetch_locked(c);

				/* One given up for close is nobody's news. */
				if (!c->stop)
					report_fetch(c, r);
			}
			continue;
		}
		if (due == INT64_MAX) {
			pthread_cond_wait(&c->cv, &c->mu);
		} else {
			/* Wall-clock deadlines (expiry is wall time); a jump of the clock
			 * only moves the refresh, and at most by a second. */
			struct timespec ts = { .tv_sec = (time_t)(due < t + 1 ? t + 1 : due) };

			pthread_cond_timedwait(&c->cv, &c->mu, &ts);
		}
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

int
aws_creds_open(const struct aws_creds_opts *o, struct aws_creds **out, char *err, size_t errlen)
{
	struct aws_creds *c;
	char why[256] = "";
	int ret;

	*out = NULL;
	if (errlen)
		err[0] = '\0';
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return -ENOMEM;
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	atomic_init(&c->closing, 0);
	c->report = o->report;
	c->report_arg = o->report_arg;
	ret = aws_source_find(o, &c->src, why, sizeof(why));
	if (ret < 0) {
		snprintf(err, errlen, "%s", why);
		goto fail;
	}
	aws_source_set_abort(c->src, &c->closing);
	pthread_mutex_lock(&c->mu);
	ret = fetch_locked(c);
	pthread_mutex_unlock(&c->mu);
	if (ret < 0) {
		if (aws_source_is_fallback(c->src)) {
			/* IMDS is only asked because nothing else is configured:
			 * off EC2 its failure means "no credentials". */
			snprintf(err, errlen, "no credentials: none in the environment, the shared "
				 "files, web identity or a container endpoint, and %.180s",
				 c->last_error);
			ret = ret == -ENOMEM ? ret : -ENOENT;
		} else {
			snprintf(err, errlen, "%s", c->last_error);
			/* The header's errnos: a timeout or a broken answer is EIO. */
			if (ret != -ENOMEM && ret != -EACCES && ret != -EINVAL && ret != -ENOENT)
				ret = -EIO;
		}
		goto fail;
	}
	/* Keys that never expire need no thread; aws_creds_refresh() still fetches. */
	if (c->cur->k.expires != 0) {
		ret = -pthread_create(&c->thread, NULL, refresh_main, c);
		if (ret < 0) {
			snprintf(err, errlen, "cannot start the credentials refresh thread: %s",
				 strerror(-ret));
			goto fail;
		}
		c->has_thread = 1;
	}
	*out = c;
	return 0;
fail:
	aws_creds_close(c);
	return ret;
}

void
aws_creds_close(struct aws_creds *c)
{
	if (c == NULL)
		return;
	if (c->has_thread) {
		/* A fetch in flight gives up now rather than at its timeout. */
		atomic_store(&c->closing, 1);
		pthread_mutex_lock(&c->mu);
		c->stop = 1;
		pthread_cond_broadcast(&c->cv);
		pthread_mutex_unlock(&c->mu);
		pthread_join(c->thread, NULL);
	}
	if (c->cur)
		aws_key_put(&c->cur->k);
	aws_source_free(c->src);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

static int
expired(const struct key_ref *r)
{
	return r->k.expires != 0 && r->k.expires <= now_s() + EXPIRY_MARGIN_S;
}

int
aws_creds_get(struct aws_creds *c, const struct aws_key **out)
{
	int ret = 0;

	*out = NULL;
	pthread_mutex_lock(&c->mu);
	if (expired(c->cur)) {
		/* The thread fell behind (a source that kept failing): one attempt here. */
		uint64_t gen = c->cur->k.generation;

		while (c->fetching)
			pthread_cond_wait(&c->cv, &c->mu);
		/* Within a failed fetch's backoff, fail at once: a reader per
		 * thread must not queue up behind one fetch after another. */
		if (c->cur->k.generation == gen && now_s() >= c->next_try) {
			ret = fetch_locked(c);
			report_fetch(c, ret);
		}
		if (expired(c->cur))
			ret = -EKEYEXPIRED;
	}
	if (ret == 0) {
		atomic_fetch_add(&c->cur->refs, 1);
		*out = &c->cur->k;
	}
	pthread_mutex_unlock(&c->mu);
	return ret;
}

int
aws_creds_refresh(struct aws_creds *c, uint64_t gen)
{
	int ret = 0;

	pthread_mutex_lock(&c->mu);
	while (c->fetching)
		pthread_cond_wait(&c->cv, &c->mu);
	/* Within a failed fetch's backoff the answer is that failure: with STS
	 * down, every refused request must not queue a fetch of its own. */
	if (c->cur->k.generation <= gen && now_s() < c->next_try) {
		ret = c->last_ret;
	} else if (c->cur->k.generation <= gen) {
		ret = fetch_locked(c);
		report_fetch(c, ret);
	}
	pthread_mutex_unlock(&c->mu);
	return ret;
}

void
aws_creds_stale(struct aws_creds *c, uint64_t gen)
{
	pthread_mutex_lock(&c->mu);
	if (c->cur->k.generation <= gen && c->has_thread && now_s() >= c->next_try) {
		c->hurry = 1;
		pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
}

void
aws_creds_info(struct aws_creds *c, struct aws_creds_info *i)
{
	memset(i, 0, sizeof(*i));
	pthread_mutex_lock(&c->mu);
	snprintf(i->source, sizeof(i->source), "%s", aws_source_name(c->src));
	snprintf(i->kind, sizeof(i->kind), "%s", aws_source_kind(c->src));
	i->expires = c->cur ? c->cur->k.expires : 0;
	i->refreshes = c->refreshes;
	i->refresh_failures = c->failures;
	snprintf(i->last_error, sizeof(i->last_error), "%s", c->last_error);
	pthread_mutex_unlock(&c->mu);
}
