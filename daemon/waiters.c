/*
 * Waiters of attach-with-timeout. A publish wakes the waiters for its name
 * through waiters_wake() (main.c hooks it to the registry's on_publish), so
 * nothing polls; a waiter with a timeout also holds a one-shot loop timer.
 * Waiters live on one list; a client rarely has more than a few, and
 * CONN_WAITERS_MAX (dispatch) caps them per client.
 */
#include "waiters.h"

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct waiter {
	struct waiters *ws;         /* borrowed */
	struct waiter_owner *owner; /* borrowed; NULL once dropped while firing */
	struct waiter_req req;
	bool has_timer;
	uv_timer_t timer;
	struct waiter *prev, *next;
};

void waiters_init(struct waiters *ws, uv_loop_t *loop, waiter_done_fn *on_done, void *ctx)
{
	memset(ws, 0, sizeof(*ws));
	ws->loop = loop;
	ws->on_done = on_done;
	ws->ctx = ctx;
}

static void waiter_unlink(struct waiters *ws, struct waiter *w)
{
	if (w->prev)
		w->prev->next = w->next;
	else
		ws->head = w->next;
	if (w->next)
		w->next->prev = w->prev;
	w->prev = w->next = NULL;
	if (w->owner)
		w->owner->n_waiters--;
}

static void waiter_free_cb(uv_handle_t *h)
{
	free(h->data);
}

/* The memory goes once libuv lets go of the timer, if there is one. */
static void waiter_free(struct waiter *w)
{
	if (w->has_timer) {
		uv_timer_stop(&w->timer);
		uv_close((uv_handle_t *)&w->timer, waiter_free_cb);
	} else {
		free(w);
	}
}

static void on_timeout(uv_timer_t *h)
{
	struct waiter *w = h->data;
	struct waiters *ws = w->ws;
	struct waiter_owner *o = w->owner;

	waiter_unlink(ws, w);
	ws->on_done(o, &w->req, -ETIMEDOUT, ws->ctx);
	waiter_free(w);
}

int waiters_add(struct waiters *ws, struct waiter_owner *o, const struct waiter_req *req,
		int64_t timeout_ms)
{
	struct waiter *w;

	assert(req->name_len <= TENSORD_NAME_MAX && req->name[req->name_len] == '\0');
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->ws = ws;
	w->owner = o;
	w->req = *req;
	if (timeout_ms > 0) {
		uv_timer_init(ws->loop, &w->timer);
		w->timer.data = w;
		w->has_timer = true;
		uv_timer_start(&w->timer, on_timeout, (uint64_t)timeout_ms, 0);
	}
	w->next = ws->head;
	if (ws->head)
		ws->head->prev = w;
	ws->head = w;
	o->n_waiters++;
	return 0;
}

void waiters_wake(struct waiters *ws, const char *name, size_t len)
{
	struct waiter *w, *next;

	/* on_done never publishes, so wakes do not nest. */
	assert(!ws->firing);
	/* Take the matching waiters off the list first: answering one may
	 * close its connection, which drops its owner's waiters. Those left on
	 * ws->firing are then only marked, and not called back. */
	for (w = ws->head; w; w = next) {
		next = w->next;
		if (w->req.name_len == len && memcmp(w->req.name, name, len) == 0) {
			waiter_unlink(ws, w);
			w->next = ws->firing;
			ws->firing = w;
		}
	}
	while ((w = ws->firing)) {
		ws->firing = w->next;
		w->next = NULL;
		if (w->owner)
			ws->on_done(w->owner, &w->req, 0, ws->ctx);
		waiter_free(w);
	}
}

void waiters_drop_owner(struct waiters *ws, struct waiter_owner *o)
{
	struct waiter *w, *next;

	for (w = ws->head; w && o->n_waiters; w = next) {
		next = w->next;
		if (w->owner == o) {
			waiter_unlink(ws, w);
			waiter_free(w);
		}
	}
	for (w = ws->firing; w; w = w->next)
		if (w->owner == o)
			w->owner = NULL;
}

void waiters_drop_all(struct waiters *ws)
{
	struct waiter *w;

	while ((w = ws->head)) {
		waiter_unlink(ws, w);
		waiter_free(w);
	}
	for (w = ws->firing; w; w = w->next)
		w->owner = NULL;
}
