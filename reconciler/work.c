/*
 * work: a few threads for the blocking parts of a job (staging reads,
 * sealing and signing, file:// puts, metadata transactions). The loop
 * submits tasks; a worker runs task->run, queues the task on the done list
 * and wakes the loop (event_active, thread-safe under evthread_use_pthreads),
 * which calls task->done. Tasks never touch loop state in run.
 */
#include <errno.h>
#include <stdlib.h>

#include <event2/event.h>

#include "log.h"
#include "reconciler.h"

static void *worker_main(void *arg)
{
	struct rec *r = arg;

	pthread_mutex_lock(&r->work_lock);
	for (;;) {
		struct task *t;

		while (!r->work_stopping && TAILQ_EMPTY(&r->work_q))
			pthread_cond_wait(&r->work_cond, &r->work_lock);
		if (r->work_stopping)
			break;
		t = TAILQ_FIRST(&r->work_q);
		TAILQ_REMOVE(&r->work_q, t, link);
		pthread_mutex_unlock(&r->work_lock);
		t->run(t);
		pthread_mutex_lock(&r->work_lock);
		TAILQ_INSERT_TAIL(&r->done_q, t, link);
		event_active(r->work_done_ev, EV_READ, 0);
	}
	pthread_mutex_unlock(&r->work_lock);
	return NULL;
}

/* On the loop: run the done callbacks of finished tasks. */
static void work_done_cb(evutil_socket_t fd, short what, void *arg)
{
	struct rec *r = arg;
	struct task_list done;

	TAILQ_INIT(&done);
	pthread_mutex_lock(&r->work_lock);
	TAILQ_CONCAT(&done, &r->done_q, link);
	pthread_mutex_unlock(&r->work_lock);
	while (!TAILQ_EMPTY(&done)) {
		struct task *t = TAILQ_FIRST(&done);
		TAILQ_REMOVE(&done, t, link);
		r->tasks_out--;
		t->done(t);
	}
	rec_check_done(r);
}

int work_start(struct rec *r, unsigned nthreads)
{
	TAILQ_INIT(&r->work_q);
	TAILQ_INIT(&r->done_q);
	pthread_mutex_init(&r->work_lock, NULL);
	pthread_cond_init(&r->work_cond, NULL);
	r->work_done_ev = event_new(r->base, -1, 0, work_done_cb, r);
	r->threads = calloc(nthreads, sizeof(*r->threads));
	if (!r->work_done_ev || !r->threads)
		return -ENOMEM;
	for (; r->nthreads < nthreads; r->nthreads++) {
		int rc = pthread_create(&r->threads[r->nthreads], NULL, worker_main, r);
		if (rc)
			return -rc;
	}
	return 0;
}

void work_submit(struct rec *r, struct task *t)
{
	r->tasks_out++;
	pthread_mutex_lock(&r->work_lock);
	TAILQ_INSERT_TAIL(&r->work_q, t, link);
	pthread_cond_signal(&r->work_cond);
	pthread_mutex_unlock(&r->work_lock);
}

void work_stop(struct rec *r)
{
	struct task_list left;

	if (!r->threads)
		return;
	pthread_mutex_lock(&r->work_lock);
	r->work_stopping = true;
	pthread_cond_broadcast(&r->work_cond);
	pthread_mutex_unlock(&r->work_lock);
	for (unsigned i = 0; i < r->nthreads; i++)
		pthread_join(r->threads[i], NULL);
	free(r->threads);
	r->threads = NULL;
	/* What never ran and what ran but was not collected: hand back now. */
	TAILQ_INIT(&left);
	TAILQ_CONCAT(&left, &r->done_q, link);
	TAILQ_CONCAT(&left, &r->work_q, link);
	while (!TAILQ_EMPTY(&left)) {
		struct task *t = TAILQ_FIRST(&left);
		TAILQ_REMOVE(&left, t, link);
		r->tasks_out--;
		t->cancelled = true;
		t->done(t);
	}
	if (r->work_done_ev)
		event_free(r->work_done_ev);
	r->work_done_ev = NULL;
	pthread_cond_destroy(&r->work_cond);
	pthread_mutex_destroy(&r->work_lock);
}
