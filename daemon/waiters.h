/*
 * Waiters: attaches with a timeout, parked until their tensor's name is
 * published (no polling) or their loop timer fires. This file knows names
 * and timers only; what a finished waiter means (a lease, an error reply)
 * is up to the on_done callback, which server.c sets. Everything runs on the
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
TAILQ_HEAD(waiter_list, waiter);

/* Embedded in whoever waits: one per client connection. */
struct waiter_owner {
	void *data;               /* the embedder's; never read here */
	unsigned n_waiters;       /* its waiters still parked */
	LIST_HEAD(, waiter) list; /* those waiters; closing walks only these */
};

/*
 * What a set waiter (an AttachMany) waits on: a prefix, or names (sorted,
 * each NUL-terminated, one after the other in names[]); and the share ids
 * its client holds. One allocation; the waiter owns it.
 */
struct waiter_set {
	size_t prefix_len;    /* with n_names 0: every name starting with prefix */
	size_t n_names;       /* the names, sorted */
	const char **name;    /* n_names pointers into bytes[] */
	size_t n_have_shares; /* have_shares: the client's slabs */
	uint64_t *have_shares;
	char prefix[TENSORD_NAME_MAX + 1];
	char bytes[]; /* the names' bytes; name[] and have_shares[] point in here */
};

/* One parked request, as waiters_add() copies it and on_done gets it back. */
struct waiter_req {
	uint64_t req_id;
	uint64_t have_id;
	bool bind; /* Attach: bind the lease (Attach.bind) */
	/* Nonzero: only something newer: a generation of name (Attach), a
	 * commit that touched the set (AttachMany). */
	uint64_t after;
	char name[TENSORD_NAME_MAX + 1]; /* Attach */
	size_t name_len;
	struct waiter_set *set; /* AttachMany: owned by the waiter once parked; else NULL */
};

/*
 * A waiter is done: status 0 when its name was published (newer than its
 * after) or its set is ready, -ETIMEDOUT when its timer fired, -ECANCELED
 * when it was cancelled. Only called for an owner not dropped. req is
 * borrowed: valid until on_done returns. on_done may add waiters and drop
 * owners.
 */
typedef void waiter_done_fn(struct waiter_owner *o, const struct waiter_req *req, int status,
			    void *ctx);

/*
 * Whether a set waiter a commit touched is ready to be answered (its
 * members all published, ...): asked before on_done, only for set waiters.
 */
typedef bool waiter_ready_fn(struct waiter_owner *o, const struct waiter_req *req, void *ctx);

/*
 * Parked waiters are kept per name (a hash map name -> list, oldest first)
 * and per owner, so a publish visits only its name's waiters and a close
 * only its own.
 */
struct waiters {
	uv_loop_t *loop;
	waiter_done_fn *on_done;
	waiter_ready_fn *set_ready;   /* NULL: every touched set waiter is ready */
	void *ctx;                    /* handed to on_done and set_ready */
	struct waiter_list sets;      /* set waiters, oldest first */
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

/*
 * Parks a set waiter for o: req->set (owned from now on, also on failure)
 * says what it waits on. As waiters_add() otherwise.
 */
int waiters_add_set(struct waiters *ws, struct waiter_owner *o, const struct waiter_req *req,
		    int64_t timeout_ms);

/*
 * name was just published as generation: every waiter for it whose after
 * is older is done, with status 0.
 */
void waiters_wake(struct waiters *ws, const char *name, size_t len, uint64_t generation);

/*
 * A commit changed the names[0 .. n) (name_of(v, i) gives each): every set
 * waiter one of them touches, and whose set_ready says so, is done with
 * status 0.
 */
void waiters_wake_sets(struct waiters *ws, const void *v, size_t n,
		       const char *(*name_of)(const void *v, size_t i, size_t *ret_len));

/* Answers o's parked request req_id with -ECANCELED. 0, or -ENOENT when none is parked. */
int waiters_cancel(struct waiters *ws, struct waiter_owner *o, uint64_t req_id);

/* Drops o's waiters without calling back. */
void waiters_drop_owner(struct waiters *ws, struct waiter_owner *o);

/* Drops every waiter without calling back, and frees the map (shutdown). */
void waiters_drop_all(struct waiters *ws);

#endif
