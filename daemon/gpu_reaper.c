/*
 * The GPU reaper (gpu_reaper.h): a FIFO of jobs and one thread that runs
 * them. A plain pthread rather than libuv's thread pool: the backends that
 * queue jobs know no loop, nobody needs a completion callback, and libuv's
 * pool is shared with file-system work whose latency these frees should
 * not add to.
 */
#include "gpu_reaper.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "log.h"

struct job {
	void (*fn)(void *arg);
	void *arg;
	struct job *next;
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;     /* a job was queued, one finished, or stop */
	struct job *head, *tail; /* queued, not yet started */
	unsigned running;        /* 1 while the worker runs a job */
	bool started, stop;
	pthread_t thread;
} reaper = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static void *reaper_main(void *unused)
{
	pthread_mutex_lock(&reaper.lock);
	for (;;) {
		struct job *j = reaper.head;

		if (!j) {
			if (reaper.stop)
				break;
			pthread_cond_wait(&reaper.cond, &reaper.lock);
			continue;
		}
		reaper.head = j->next;
		if (!reaper.head)
			reaper.tail = NULL;
		reaper.running = 1;
		pthread_mutex_unlock(&reaper.lock);
		j->fn(j->arg);
		free(j);
		pthread_mutex_lock(&reaper.lock);
		reaper.running = 0;
		pthread_cond_broadcast(&reaper.cond);
	}
	pthread_mutex_unlock(&reaper.lock);
	return NULL;
}

/* Lock held. */
static bool reaper_start(void)
{
	if (reaper.started)
		return true;
	reaper.stop = false;
	if (pthread_create(&reaper.thread, NULL, reaper_main, NULL) != 0) {
		log_warn("gpu reaper: no thread, freeing GPU memory on the loop thread");
		return false;
	}
	reaper.started = true;
	return true;
}

void gpu_reaper_run(void (*fn)(void *arg), void *arg)
{
	struct job *j = malloc(sizeof(*j));

	pthread_mutex_lock(&reaper.lock);
	if (!j || !reaper_start()) {
		pthread_mutex_unlock(&reaper.lock);
		free(j);
		fn(arg);
		return;
	}
	*j = (struct job){ fn, arg, NULL };
	if (reaper.tail)
		reaper.tail->next = j;
	else
		reaper.head = j;
	reaper.tail = j;
	pthread_cond_broadcast(&reaper.cond);
	pthread_mutex_unlock(&reaper.lock);
}

void gpu_reaper_drain(void)
{
	pthread_mutex_lock(&reaper.lock);
	while (reaper.head || reaper.running)
		pthread_cond_wait(&reaper.cond, &reaper.lock);
	pthread_mutex_unlock(&reaper.lock);
}

void gpu_reaper_stop(void)
{
	pthread_mutex_lock(&reaper.lock);
	if (!reaper.started) {
		pthread_mutex_unlock(&reaper.lock);
		return;
	}
	reaper.stop = true;
	pthread_cond_broadcast(&reaper.cond);
	pthread_mutex_unlock(&reaper.lock);
	pthread_join(reaper.thread, NULL);
	pthread_mutex_lock(&reaper.lock);
	reaper.started = false;
	reaper.stop = false;
	pthread_mutex_unlock(&reaper.lock);
}
