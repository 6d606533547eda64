/*
 * Waiters of attach-with-timeout. A publish wakes the waiters for its name
 * through waiters_wake() (dispatch hooks it to the registry's commits), so
 * nothing polls; a waiter with a timeout also holds a one-shot loop timer.
 *
 * Each waiter of one name is on two lists: its name's (in a hash map of
 * names, oldest first) and its owner's. A publish visits only the waiters
 * of its name, a closing connection only its own: with hundreds of
 * thousands of waiters parked, neither walks the others. Set waiters
 * (AttachMany) are on one list of their own, which every commit walks
 * (they wait on prefixes as well as names); they count against the same
 * limits.
 */
#include "waiters.h"

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"

/* The waiters of one name, oldest first; freed when its last waiter goes. */
struct waiter_name {
	struct waiter_name *hnext;
	struct waiter_list list;
	size_t len;
	char name[];
};

struct waiter {
	struct waiters *ws;         /* borrowed */
	struct waiter_owner *owner; /* borrowed; NULL once dropped while firing */
	struct waiter_name *wn;     /* borrowed; NULL once taken off by a wake */
	bool on_sets;               /* a set waiter, on ws->sets */
	struct waiter_req req;
	bool has_timer;
	bool firing; /* taken off by waiters_wake(), not yet called back */
	uv_timer_t timer;
	TAILQ_ENTRY(waiter) name_link; /* the name's list, or the firing list */
	LIST_ENTRY(waiter) owner_link; /* the owner's list */
};

void waiters_init(struct waiters *ws, uv_loop_t *loop, waiter_done_fn *on_done, void *ctx)
{
	memset(ws, 0, sizeof(*ws));
	ws->loop = loop;
	ws->on_done = on_done;
	ws->ctx = ctx;
	TAILQ_INIT(&ws->sets);
}

static struct waiter_name **bucket_of(struct waiters *ws, const char *name, size_t len)
{
	return &ws->buckets[td_hash_name(name, len) & (ws->n_buckets - 1)];
}

static struct waiter_name *name_find(struct waiters *ws, const char *name, size_t len)
{
	if (!ws->n_buckets)
		return NULL;
	for (struct waiter_name *wn = *bucket_of(ws, name, len); wn; wn = wn->hnext)
		if (wn->len == len && memcmp(wn->name, name, len) == 0)
			return wn;
	return NULL;
}

static int grow(struct waiters *ws)
{
	size_t n = ws->n_buckets ? ws->n_buckets * 2 : 64;
	struct waiter_name **nb = calloc(n, sizeof(*nb));

	if (!nb)
		return -ENOMEM;
	for (size_t i = 0; i < ws->n_buckets; i++) {
		struct waiter_name *wn, *next;

		for (wn = ws->buckets[i]; wn; wn = next) {
			struct waiter_name **b = &nb[td_hash_name(wn->name, wn->len) & (n - 1)];

			next = wn->hnext;
			wn->hnext = *b;
			*b = wn;
		}
	}
	free(ws->buckets);
	ws->buckets = nb;
	ws->n_buckets = n;
	return 0;
}

/* The entry for name, made if needed. NULL: out of memory. */
static struct waiter_name *name_get(struct waiters *ws, const char *name, size_t len)
{
	struct waiter_name *wn = name_find(ws, name, len), **b;

	if (wn)
		return wn;
	if (ws->n_names + 1 > ws->n_buckets && grow(ws) < 0)
		return NULL;
	wn = calloc(1, sizeof(*wn) + len + 1);
	if (!wn)
		return NULL;
	TAILQ_INIT(&wn->list);
	memcpy(wn->name, name, len);
	wn->len = len;
	b = bucket_of(ws, name, len);
	wn->hnext = *b;
	*b = wn;
	ws->n_names++;
	return wn;
}

static void name_remove(struct waiters *ws, struct waiter_name *wn)
{
	for (struct waiter_name **p = bucket_of(ws, wn->name, wn->len); *p; p = &(*p)->hnext) {
		if (*p == wn) {
			*p = wn->hnext;
			break;
		}
	}
	ws->n_names--;
	free(wn);
}

/* Takes w off its name's list (the name goes with its last waiter), or off the sets. */
static void unlink_name(struct waiters *ws, struct waiter *w)
{
	struct waiter_name *wn = w->wn;

	if (w->on_sets) {
		TAILQ_REMOVE(&ws->sets, w, name_link);
		w->on_sets = false;
		ws->n_waiters--;
		return;
	}
	if (!wn)
		return;
	assert(!w->firing && ws->n_waiters > 0);
	TAILQ_REMOVE(&wn->list, w, name_link);
	w->wn = NULL;
	ws->n_waiters--;
	if (TAILQ_EMPTY(&wn->list))
		name_remove(ws, wn);
}

static void unlink_owner(struct waiter *w)
{
	struct waiter_owner *o = w->owner;

	if (!o)
		return;
	assert(o->n_waiters > 0);
	LIST_REMOVE(w, owner_link);
	o->n_waiters--;
}

static void waiter_free_cb(uv_handle_t *h)
{
	free(h->data);
}

/* w's timer, when it has a timeout. */
static void waiter_arm(struct waiters *ws, struct waiter *w, int64_t timeout_ms);

static void waiter_free_cb(uv_handle_t *h);

/* The memory goes once libuv lets go of the timer, if there is one. */
static void waiter_free(struct waiter *w)
{
	free(w->req.set);
	w->req.set = NULL;
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

	unlink_name(ws, w);
	unlink_owner(w);
	ws->on_done(o, &w->req, -ETIMEDOUT, ws->ctx);
	waiter_free(w);
}

int waiters_add(struct waiters *ws, struct waiter_owner *o, const struct waiter_req *req,
		int64_t timeout_ms)
{
	struct waiter_name *wn;
	struct waiter *w;

	assert(req->name_len <= TENSORD_NAME_MAX && req->name[req->name_len] == '\0');
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	wn = name_get(ws, req->name, req->name_len);
	if (!wn) {
		free(w);
		return -ENOMEM;
	}
	w->ws = ws;
	w->owner = o;
	w->wn = wn;
	w->req = *req;
	w->req.set = NULL;
	waiter_arm(ws, w, timeout_ms);
	TAILQ_INSERT_TAIL(&wn->list, w, name_link);
	LIST_INSERT_HEAD(&o->list, w, owner_link);
	o->n_waiters++;
	ws->n_waiters++;
	return 0;
}

static void waiter_arm(struct waiters *ws, struct waiter *w, int64_t timeout_ms)
{
	if (timeout_ms > 0) {
		uv_timer_init(ws->loop, &w->timer);
		w->timer.data = w;
		w->has_timer = true;
		uv_timer_start(&w->timer, on_timeout, (uint64_t)timeout_ms, 0);
	}
}

int waiters_add_set(struct waiters *ws, struct waiter_owner *o, const struct waiter_req *req,
		    int64_t timeout_ms)
{
	struct waiter *w = calloc(1, sizeof(*w));

	if (!w) {
		free(w);
		free(req->set);
		return -ENOMEM;
	}
	w->ws = ws;
	w->owner = o;
	w->req = *req;
	w->on_sets = true;
	waiter_arm(ws, w, timeout_ms);
	TAILQ_INSERT_TAIL(&ws->sets, w, name_link);
	LIST_INSERT_HEAD(&o->list, w, owner_link);
	o->n_waiters++;
	ws->n_waiters++;
	return 0;
}

/* Answers the waiters on the firing list (taken off their lists already), in order. */
static void fire(struct waiters *ws, struct waiter_list *firing)
{
	struct waiter *w;

	while ((w = TAILQ_FIRST(firing))) {
		struct waiter_owner *o = w->owner;

		TAILQ_REMOVE(firing, w, name_link);
		unlink_owner(w);
		if (o)
			ws->on_done(o, &w->req, 0, ws->ctx);
		waiter_free(w);
	}
}

void waiters_wake(struct waiters *ws, const char *name, size_t len, uint64_t generation)
{
	struct waiter_name *wn = name_find(ws, name, len);
	struct waiter_list firing = TAILQ_HEAD_INITIALIZER(firing);
	struct waiter *w, *next;

	if (!wn)
		return;
	/* Take the waiters to answer off first: answering one waiter may
	 * close its connection, which drops its owner's waiters. Those still
	 * to be answered are then only marked (owner NULL), not called back.
	 * A waiter for a generation newer than this one stays. */
	for (w = TAILQ_FIRST(&wn->list); w; w = next) {
		next = TAILQ_NEXT(w, name_link);
		ws->visits++;
		if (w->req.after >= generation)
			continue;
		TAILQ_REMOVE(&wn->list, w, name_link);
		TAILQ_INSERT_TAIL(&firing, w, name_link);
		w->firing = true;
		w->wn = NULL;
		ws->n_waiters--;
	}
	if (TAILQ_EMPTY(&wn->list))
		name_remove(ws, wn);
	fire(ws, &firing);
}

/* a (NUL-terminated) against name (len bytes), as strcmp would order them. */
static int cmp_len(const char *a, const char *name, size_t len)
{
	int c = strncmp(a, name, len);

	return c ? c : a[len] != '\0';
}

/* Whether name (len bytes) is one set waits on. */
static bool set_touched(const struct waiter_set *s, const char *name, size_t len)
{
	size_t lo = 0, hi = s->n_names;

	if (!s->n_names)
		return len >= s->prefix_len && memcmp(name, s->prefix, s->prefix_len) == 0;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = cmp_len(s->name[mid], name, len);

		if (c == 0)
			return true;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

void waiters_wake_sets(struct waiters *ws, const void *v, size_t n,
		       const char *(*name_of)(const void *v, size_t i, size_t *ret_len))
{
	struct waiter_list firing = TAILQ_HEAD_INITIALIZER(firing);
	struct waiter *w, *next;

	for (w = TAILQ_FIRST(&ws->sets); w; w = next) {
		bool touched = false;

		next = TAILQ_NEXT(w, name_link);
		for (size_t i = 0; i < n && !touched; i++) {
			size_t len;
			const char *name = name_of(v, i, &len);

			ws->visits++;
			touched = set_touched(w->req.set, name, len);
		}
		if (!touched || (ws->set_ready && !ws->set_ready(w->owner, &w->req, ws->ctx)))
			continue;
		TAILQ_REMOVE(&ws->sets, w, name_link);
		TAILQ_INSERT_TAIL(&firing, w, name_link);
		w->on_sets = false;
		w->firing = true;
		ws->n_waiters--;
	}
	fire(ws, &firing);
}

int waiters_cancel(struct waiters *ws, struct waiter_owner *o, uint64_t req_id)
{
	struct waiter *w;

	LIST_FOREACH(w, &o->list, owner_link)
	{
		ws->visits++;
		if (w->req.req_id != req_id || w->firing)
			continue;
		unlink_name(ws, w);
		unlink_owner(w);
		ws->on_done(o, &w->req, -ECANCELED, ws->ctx);
		waiter_free(w);
		return 0;
	}
	return -ENOENT;
}

void waiters_drop_owner(struct waiters *ws, struct waiter_owner *o)
{
	struct waiter *w, *next;

	for (w = LIST_FIRST(&o->list); w; w = next) {
		next = LIST_NEXT(w, owner_link);
		ws->visits++;
		unlink_owner(w);
		w->owner = NULL;
		/* One being answered by waiters_wake() is freed there. */
		if (!w->firing) {
			unlink_name(ws, w);
			waiter_free(w);
		}
	}
}

void waiters_drop_all(struct waiters *ws)
{
	struct waiter *w;

	while ((w = TAILQ_FIRST(&ws->sets))) {
		ws->visits++;
		unlink_owner(w);
		w->owner = NULL;
		unlink_name(ws, w);
		waiter_free(w);
	}
	for (size_t i = 0; i < ws->n_buckets; i++) {
		while (ws->buckets[i]) {
			w = TAILQ_FIRST(&ws->buckets[i]->list);
			ws->visits++;
			unlink_owner(w);
			w->owner = NULL;
			unlink_name(ws, w);
			waiter_free(w);
		}
	}
	free(ws->buckets);
	ws->buckets = NULL;
	ws->n_buckets = ws->n_names = 0;
}
