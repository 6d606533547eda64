/*
 * Watches (docs/design.md, "Watches"): a connection's watchers of a prefix
 * get the changes of every commit step as Events replies carrying the
 * Watch request's id, in commit order, for names their uid may read.
 *
 * Memory is bounded per watcher and per uid: events wait in a queue of at
 * most its size (at most --max-watch-queue) while the connection has more
 * than WATCH_OUT_LIMIT bytes of replies unread, each event taking its
 * name's length, charged to the uid's share (QUOTA_WATCH_BYTES). A full
 * queue, or a uid past its share, coalesces (a newer event of a name
 * replaces the one queued) or drops the oldest, and the next batch starts
 * with a lagged event. A watcher that never reads costs its queue and no
 * more, and a uid's watches together no more than its share.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "common/desc.h"
#include "dispatch_int.h"
#include "daemon/base/log.h"
#include "reply.h"
#include "server.h"
#include "watch.h"

/* One queued event, its name at its length (and a NUL, for the reply). */
struct watch_event {
	TAILQ_ENTRY(watch_event) link;
	uint64_t generation, commit;
	uint16_t name_len;
	uint8_t kind; /* Tensord__Event__Kind */
	char name[];
};

struct watcher {
	struct client *cl; /* borrowed: the connection it belongs to */
	uint64_t id;       /* the Watch request's: its replies carry it */
	size_t prefix_len;
	char prefix[TENSORD_NAME_MAX + 1];
	uint32_t size;                          /* the most events it queues */
	TAILQ_HEAD(watch_queue, watch_event) q; /* owned, oldest first */
	uint32_t n;                             /* events queued */
	uint64_t bytes;                         /* theirs, charged to the uid (QUOTA_WATCH_BYTES) */
	bool lagged;                            /* events were lost since the last batch */
	LIST_ENTRY(watcher) link;               /* every watcher: watches.all */
	LIST_ENTRY(watcher) mine;               /* its client's */
};

static struct {
	LIST_HEAD(, watcher) all;
	unsigned n;
	bool init;
} watches;

static void watches_init(void)
{
	if (!watches.init) {
		LIST_INIT(&watches.all);
		watches.init = true;
	}
}

/* What an event of a name of len bytes costs its uid. */
static size_t event_bytes(size_t name_len)
{
	return sizeof(struct watch_event) + name_len + 1;
}

/* w's uid pays for bytes more of queue: false past its share (nothing charged). */
static bool charge(struct watcher *w, size_t bytes)
{
	char why[200];

	if (quota_charge(&w->cl->srv->quota, w->cl->rc.uid, QUOTA_WATCH_BYTES, bytes, why,
			 sizeof(why)) < 0)
		return false;
	w->bytes += bytes;
	return true;
}

/* The oldest queued event leaves w, its uid paid back: the caller's to free. */
static struct watch_event *take_oldest(struct watcher *w)
{
	struct watch_event *e = TAILQ_FIRST(&w->q);
	size_t bytes = event_bytes(e->name_len);

	TAILQ_REMOVE(&w->q, e, link);
	w->n--;
	w->bytes -= bytes;
	quota_uncharge(&w->cl->srv->quota, w->cl->rc.uid, QUOTA_WATCH_BYTES, bytes);
	return e;
}

static void drop_oldest(struct watcher *w)
{
	free(take_oldest(w));
}

static void fill(struct watch_event *e, const struct reg_change *c)
{
	e->kind = c->kind == REG_PUBLISHED ? TENSORD__EVENT__KIND__PUBLISHED
					   : TENSORD__EVENT__KIND__UNLINKED;
	e->generation = c->generation;
	e->commit = c->commit;
}

/*
 * Queues one event for w. A full queue, or its uid past its share of
 * queued bytes, coalesces (the newest event of a name replaces the one
 * queued, in place: same name, same size; looked for among the newest
 * WATCH_COALESCE_SCAN, so that an event costs bounded work however long
 * the queue) or drops the oldest for it (the event itself is lost when
 * that does not make room), and says so.
 */
static void enqueue(struct watcher *w, const struct reg_change *c)
{
	size_t bytes = event_bytes(c->name_len);
	struct watch_event *e;
	unsigned scanned = 0;

	if (w->n >= w->size || !charge(w, bytes)) {
		w->lagged = true;
		TAILQ_FOREACH_REVERSE(e, &w->q, watch_queue, link)
		{
			if (++scanned > WATCH_COALESCE_SCAN)
				break;
			if (e->name_len == c->name_len &&
			    memcmp(e->name, c->name, c->name_len) == 0) {
				fill(e, c);
				return;
			}
		}
		if (w->n)
			drop_oldest(w);
		if (!charge(w, bytes))
			return;
	}
	e = malloc(bytes);
	if (!e) {
		w->bytes -= bytes;
		quota_uncharge(&w->cl->srv->quota, w->cl->rc.uid, QUOTA_WATCH_BYTES, bytes);
		w->lagged = true;
		return;
	}
	fill(e, c);
	e->name_len = (uint16_t)c->name_len;
	memcpy(e->name, c->name, c->name_len);
	e->name[c->name_len] = '\0';
	TAILQ_INSERT_TAIL(&w->q, e, link);
	w->n++;
}

/* Whether w hears of c: under its prefix, and readable by its uid. */
static bool hears(const struct watcher *w, const struct reg_change *c)
{
	const struct reg_client *rc = &w->cl->rc;

	return c->name_len >= w->prefix_len && memcmp(c->name, w->prefix, w->prefix_len) == 0 &&
	       registry_may_hear(c->owner_uid, c->owner_gid, c->mode, rc);
}

/* Sends what w queued, in batches, while its connection takes them. */
static void flush(struct watcher *w)
{
	Tensord__Event ev[WATCH_BATCH], *pev[WATCH_BATCH];
	struct watch_event *sent[WATCH_BATCH];
	struct conn *c = w->cl->conn;

	while ((w->n || w->lagged) && !conn_gone(c) && c->out_bytes < WATCH_OUT_LIMIT) {
		Tensord__Reply rep = TENSORD__REPLY__INIT;
		Tensord__Events es = TENSORD__EVENTS__INIT;
		size_t k = 0, n_sent = 0;

		if (w->lagged) {
			tensord__event__init(&ev[k]);
			ev[k].kind = TENSORD__EVENT__KIND__LAGGED;
			ev[k].name = "";
			pev[k] = &ev[k];
			k++;
			w->lagged = false;
		}
		while (w->n && k < WATCH_BATCH) {
			/* Out of the queue now, freed once the frame is packed. */
			struct watch_event *e = sent[n_sent++] = take_oldest(w);

			tensord__event__init(&ev[k]);
			ev[k].kind = (Tensord__Event__Kind)e->kind;
			ev[k].name = e->name;
			ev[k].generation = e->generation;
			ev[k].commit = e->commit;
			pev[k] = &ev[k];
			k++;
		}
		es.n_events = k;
		es.events = pev;
		rep.id = w->id;
		rep.body_case = TENSORD__REPLY__BODY_EVENTS;
		rep.events = &es;
		reply_send(c, &rep, NULL);
		for (size_t i = 0; i < n_sent; i++)
			free(sent[i]);
	}
}

void watch_on_commit(struct server *srv, const struct reg_change *v, size_t n, bool lost)
{
	struct watcher *w, *next;

	watches_init();
	for (w = LIST_FIRST(&watches.all); w; w = next) {
		bool any = lost;

		next = LIST_NEXT(w, link);
		w->lagged = w->lagged || lost;
		for (size_t i = 0; i < n; i++) {
			if (!hears(w, &v[i]))
				continue;
			enqueue(w, &v[i]);
			any = true;
		}
		if (any)
			flush(w);
	}
}

void watch_drained(struct client *cl)
{
	struct watcher *w;

	LIST_FOREACH(w, &cl->watches, mine)
	flush(w);
}

static void watcher_free(struct watcher *w)
{
	LIST_REMOVE(w, link);
	LIST_REMOVE(w, mine);
	quota_uncharge(&w->cl->srv->quota, w->cl->rc.uid, QUOTA_WATCHES, 1);
	watches.n--;
	while (w->n)
		drop_oldest(w);
	free(w);
}

void watch_client_gone(struct client *cl)
{
	struct watcher *w;

	while ((w = LIST_FIRST(&cl->watches)))
		watcher_free(w);
}

/* The current state of names under w's prefix committed after `after`, in commit order. */
struct replay {
	struct watcher *w;
	uint64_t after;
	struct reg_change *v; /* owned */
	size_t n, cap;
	bool cut; /* more than fit: the watcher lags */
};

static void replay_add(void *arg, const struct reg_change *c)
{
	struct replay *r = arg;

	if (c->commit <= r->after || !hears(r->w, c))
		return;
	if (r->n == r->cap) {
		r->cut = true;
		return;
	}
	r->v[r->n++] = *c;
}

static int cmp_commit(const void *a, const void *b)
{
	const struct reg_change *x = a, *y = b;

	return x->commit < y->commit ? -1 : x->commit > y->commit;
}

static void replay(struct watcher *w, uint64_t after)
{
	struct registry *reg = &w->cl->srv->reg;
	struct replay r = { .w = w, .after = after, .cap = w->size };
	struct tensor **page = malloc(DISPATCH_SET_MAX * sizeof(*page));
	const char *next;
	size_t n;

	r.v = malloc((size_t)r.cap * sizeof(*r.v));
	if (!r.v || !page) {
		w->lagged = true;
		goto out;
	}
	/* Names published now, then names unlinked: newer than after, visible to w. */
	registry_list(reg, &w->cl->rc, w->prefix, w->prefix_len, "", DISPATCH_SET_MAX, page, &n,
		      &next);
	r.cut = next != NULL;
	for (size_t i = 0; i < n; i++) {
		struct tensor *t = page[i];
		struct reg_change c = { .kind = REG_PUBLISHED,
					.generation = t->generation,
					.commit = t->commit,
					.owner_uid = t->owner_uid,
					.owner_gid = t->owner_gid,
					.mode = t->mode,
					.tensor = t,
					.name_len = t->name_len };

		if (t->state != TENSORD_STATE_PUBLISHED)
			continue;
		memcpy(c.name, t->name, t->name_len + 1);
		replay_add(&r, &c);
	}
	registry_tombs_each(reg, w->prefix, w->prefix_len, replay_add, &r);
	qsort(r.v, r.n, sizeof(*r.v), cmp_commit);
	for (size_t i = 0; i < r.n; i++)
		enqueue(w, &r.v[i]);
	w->lagged = w->lagged || r.cut;
out:
	free(page);
	free(r.v);
}

void dispatch_do_watch(struct client *cl, uint64_t id, const Tensord__Watch *m)
{
	struct server *srv = cl->srv;
	size_t len = strlen(m->prefix);
	char why[400], reason[200];
	struct watcher *w;
	uint32_t max;
	int r;

	watches_init();
	if (len && td_name_check(m->prefix, len, reason, sizeof(reason)) < 0) {
		snprintf(why, sizeof(why), "watch: prefix: %s", reason);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_WATCH, id, -EINVAL, why);
		return;
	}
	r = quota_charge(&srv->quota, cl->rc.uid, QUOTA_WATCHES, 1, reason, sizeof(reason));
	if (r < 0) {
		snprintf(why, sizeof(why), "watch of '%s': %s", m->prefix, reason);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_WATCH, id, r, why);
		return;
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		quota_uncharge(&srv->quota, cl->rc.uid, QUOTA_WATCHES, 1);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_WATCH, id, -ENOMEM,
			     "watch: out of memory");
		return;
	}
	w->cl = cl;
	w->id = id;
	w->prefix_len = len;
	memcpy(w->prefix, m->prefix, len + 1);
	TAILQ_INIT(&w->q);
	/* Asking more than --max-watch-queue gets that many (docs/design.md, "Watches"). */
	max = srv->cfg.max_watch_queue ? srv->cfg.max_watch_queue : WATCH_QUEUE_MAX_DEFAULT;
	w->size = m->queue ? m->queue : WATCH_QUEUE_DEFAULT;
	if (w->size > max)
		w->size = max;
	LIST_INSERT_HEAD(&watches.all, w, link);
	LIST_INSERT_HEAD(&cl->watches, w, mine);
	watches.n++;
	/* The reply first: every event after it belongs to the watch. */
	reply_status(cl->conn, TENSORD__REQUEST__BODY_WATCH, id, 0, "");
	if (m->replay)
		replay(w, m->after);
	flush(w);
	log_debug("conn %llu: watching '%s' (queue %u)", (unsigned long long)cl->conn->id,
		  w->prefix, w->size);
}

void dispatch_do_unwatch(struct client *cl, uint64_t id, const Tensord__Unwatch *m)
{
	struct watcher *w;
	char why[120];

	LIST_FOREACH(w, &cl->watches, mine)
	{
		if (w->id != m->id)
			continue;
		watcher_free(w);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_UNWATCH, id, 0, "");
		return;
	}
	snprintf(why, sizeof(why), "watch %llu: no such watch on this connection",
		 (unsigned long long)m->id);
	reply_status(cl->conn, TENSORD__REQUEST__BODY_UNWATCH, id, -ENOENT, why);
}
