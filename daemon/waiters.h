/*
 * Waiters: attaches with a timeout, parked until their tensor's name is
 * published (no polling) or their loop timer fires. This file knows names
 * and timers only; what a finished waiter means (a lease, an error reply)
 * is up to the on_done callback, which main.c sets. Everything runs on the
 * one libuv loop thread.
 */
#ifndef TENSORD_WAITERS_H
#define TENSORD_WAITERS_H

#include <stddef.h>
#include <stdint.h>

#include <tensord/tensord.h>
#include <sys/queue.h>
#include <uv.h>

struct waiter;
struct waiter_name;

/* Embedded in whoever waits: one per client connection. */
struct waiter_owner {
	void *data;               /* the embedder's; never read here */
	unsigned n_waiters;       /* its waiters still parked */
	LIST_HEAD(, waiter) list; /* those waiters; closing walks only these */
};

/* One parked request, as waiters_add() copies it and on_done gets it back. */
struct waiter_req {
	uint64_t req_id;
	uint64_t have_id;
	char name[TENSORD_NAME_MAX + 1];
	size_t name_len;
};

/*
 * A waiter is done: status 0 when its name was published, -ETIMEDOUT when
 * its timer fired. Only called for an owner not dropped. req is borrowed:
 * valid until on_done returns. on_done may add waiters and drop owners.
 */
typedef void waiter_done_fn(struct waiter_owner *o, const struct waiter_req *req, int status,
			    void *ctx);

/*
 * Parked waiters are kept per name (a hash map name -> list, oldest first)
 * and per owner, so a publish visits only its name's waiters and a close
 * only its own.
 */
struct waiters {
	uv_loop_t *loop;
	waiter_done_fn *on_done;
	void *ctx;                    /* handed to on_done */
	struct waiter_name **buckets; /* owned; n_buckets, a power of two */
	size_t n_buckets, n_names;
	uint64_t n_waiters; /* parked, all owners */
	uint64_t visits;    /* waiters visited by wake and drop: work done, for stats */
};

void waiters_init(struct waiters *ws, uv_loop_t *loop, waiter_done_fn *on_done, void *ctx);

/*
 * Parks a copy of req for o. timeout_ms > 0 starts a timer; otherwise it
 * waits until woken or dropped. Waiters of one name are answered oldest
 * first. 0 or -ENOMEM. o is borrowed: it must stay
 * valid until waiters_drop_owner(o) or until its waiters are done.
 */
int waiters_add(struct waiters *ws, struct waiter_owner *o, const struct waiter_req *req,
		int64_t timeout_ms);

/* name was just published: every waiter for it is done, with status 0. */
void waiters_wake(struct waiters *ws, const char *name, size_t len);

/* Drops o's waiters without calling back. */
void waiters_drop_owner(struct waiters *ws, struct waiter_owner *o);

/* Drops every waiter without calling back, and frees the map (shutdown). */
void waiters_drop_all(struct waiters *ws);

#endif
