/*
 * libtensord's reserves (reserve.c): host memory the daemon keeps ready
 * for the next create, mapped and populated ahead by a thread
 * (docs/design.md, "The reserve"). The client's internal header
 * (client.h) includes it: the state lives in struct tensord_client,
 * guarded by the client's lock.
 */
#ifndef TENSORD_CLIENT_RESERVE_H
#define TENSORD_CLIENT_RESERVE_H

#include <stdbool.h>
#include <stdint.h>

#include <tensord/tensord.h>

#include "proto/tensord.pb-c.h"

/* Host creates from this size up may take a reserve (docs/design.md, "The reserve"). */
#define TD_RESERVE_MIN (1u << 20)
/* Reserves a client keeps at most (the daemon's most per connection). */
#define TD_RESERVE_SLOTS 4

/* One reserve this process mapped: memory the daemon holds for its next create. */
struct td_reserve_slot {
	uint64_t id;   /* the daemon's name for it */
	int fd;        /* owned; -1 when none */
	void *base;    /* owned: size bytes, shared, writable, populated, MADV_DONTFORK */
	uint64_t size; /* the memfd's size */
	/* base is a ring buffer's mapping (id: its ring id), lent to a
	 * create's lease (ring.c): never unmapped by the lease. */
	bool lent;
};

/*
 * The reserves of one client and the thread that makes them (reserve.c).
 * Guarded by the client's lock.
 */
struct td_reserve {
	uint64_t budget; /* the most bytes kept ready (TENSORD_RESERVE); 0: none */
	struct td_reserve_slot ready[TD_RESERVE_SLOTS];
	int n_ready;
	uint64_t ready_bytes;
	/* Size classes this process creates: how often lately, and when to ask again. */
	struct td_reserve_want {
		uint64_t cls;
		unsigned creates;
		uint64_t last_ns, retry_ns; /* CLOCK_MONOTONIC */
		unsigned backoff_ms;
	} want[TD_RESERVE_SLOTS];
	struct td_reserve_slot making; /* being mapped: fork's child closes its fd */
	unsigned writing;              /* slots taken whose copy is not done yet */
	uint64_t hold_until;           /* no new reserve before (CLOCK_MONOTONIC); 0: none */
	uint64_t busy_ns;              /* the last take, or end of a copy (CLOCK_MONOTONIC) */
	bool started;                  /* the thread runs */
	bool stop;                     /* tensord_close(), or a forked child */
	bool off;                      /* the daemon keeps no reserves */
	pthread_t thread;
	pthread_cond_t cond; /* with the client's lock: a create came, or stop */
};

/*
 * reserve.c (docs/design.md, "The reserve"). td_reserve_init() reads
 * TENSORD_RESERVE into r; no thread runs until creates ask for one.
 */
void td_reserve_init(struct td_reserve *r);

/*
 * Notes a host create of nbytes (so that the thread keeps memory of its
 * size ready) and takes a ready reserve that fits it: true and *ret the
 * caller's, to name in its Create (which consumes the reserve) and free
 * with td_reserve_slot_free(). Lock not held.
 */
bool td_reserve_take(tensord_client *c, uint64_t nbytes, struct td_reserve_slot *ret);

/*
 * The copy into a slot td_reserve_take() gave is done (a put's, before its
 * publish; a create's, at its publish): the thread may make the next one.
 */
void td_reserve_written(tensord_client *c);

/* Unmaps and closes s (a taken slot's reserve is the daemon's to free). */
void td_reserve_slot_free(struct td_reserve_slot *s);

/* Stops and joins the thread, gives back every ready slot. Lock not held; idempotent. */
void td_reserve_stop(tensord_client *c);

/* In a forked child: forgets the parent's slots (their mappings did not come along). */
void td_reserve_after_fork(struct td_reserve *r);

/*
 * A slot td_reserve_take() gave that a create left alone (a recycled one
 * took a ring buffer instead): ready again, or given back when no room.
 */
void td_reserve_untake(tensord_client *c, struct td_reserve_slot *s);

#endif
