/*
 * Attach without a round trip (bindings.c; docs/design.md, "Attach without
 * a round trip"): a lease the daemon bound to a slot of this connection's
 * binding page serves every later attach of its name in this process, as
 * a local lease, while the slot holds the binding's generation.
 */
#ifndef TENSORD_CLIENT_BINDINGS_H
#define TENSORD_CLIENT_BINDINGS_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/queue.h>
#include <stdbool.h>
#include <stdint.h>

#include <tensord/tensord.h>

struct td_binding;
struct td_lease;
struct td_mapping;

/*
 * Idle bindings (no local lease uses them) keep their lease and mapping for
 * the next attach, at most this many, each for at most TD_BIND_IDLE_NS
 * after its last local lease ended: a process that attached many names
 * once each holds few mappings, and one that stopped attaching holds none.
 */
#define TD_BIND_IDLE_MAX 64
#define TD_BIND_IDLE_NS 1000000000ull

enum td_bind_state { TD_BIND_UNTRIED, TD_BIND_SETTING, TD_BIND_ON, TD_BIND_OFF };

/* One client's bindings. Guarded by the client's lock, but stop. */
struct td_bindings {
	enum td_bind_state state;
	unsigned round_trips; /* attaches that asked the daemon before the page was asked for */
	const _Atomic uint64_t *words; /* the page, mapped read-only; NULL: none */
	uint32_t n_words;
	uint32_t seen;                 /* the page's clear count when last swept */
	struct td_binding **tab;       /* hash buckets of the bindings listed; owned */
	uint32_t cap, n;               /* buckets, bindings listed */
	TAILQ_HEAD(, td_binding) idle; /* listed and unused, oldest first */
	uint32_t n_idle;
	bool watcher_long; /* the watcher sleeps without a deadline: wake it for one */
	bool thread_on;    /* the watcher thread runs */
	atomic_bool stop;  /* the watcher is to stop */
	pthread_t thread;
};

/*
 * Whether attaches on c may ask for a binding: from the second attach on
 * (a connection that attaches once pays nothing), asks the daemon for the
 * page once (one round trip), maps it and starts the thread that lets go
 * of bindings whose name moved on. TENSORD_BIND=0 turns it all off. Never
 * fails: without a page, attaches take round trips.
 */
bool td_bindings_ready(tensord_client *c);

/*
 * An attach of name served from a binding: 1 with *ret_lease (a local
 * lease, to hand to td_lease_handle()), 0 when there is none to use (take
 * a round trip), or -errno (an error worth reporting).
 */
int td_binding_attach(tensord_client *c, const char *name, struct td_lease **ret_lease);

/*
 * The attach that made l was bound to slot with generation gen: l becomes
 * the binding's first local lease, and the lease the daemon granted is the
 * binding's until it is let go. l keeps working either way.
 */
void td_binding_adopt(tensord_client *c, struct td_lease *l, uint32_t slot, uint64_t gen);

/* Incremented in each forked child (fork.c): bindings made before it count nothing there. */
extern atomic_uint td_forks;

/* One reference fewer on b; the last one ends the daemon's lease. */
void td_binding_unref(struct td_binding *b);

/* A local lease on b ended: one fewer in the count the daemon reads, and its reference. */
void td_binding_local_end(struct td_binding *b);

/* tensord_close(): every binding is let go (their Releases queued), the thread stopped. */
void td_bindings_close(tensord_client *c);

/* The client's last reference: the thread stopped, the page unmapped. */
void td_bindings_fini(tensord_client *c);

/* In a forked child: the parent's bindings are not ours (no thread, no page here). */
void td_bindings_after_fork(tensord_client *c);

#endif /* TENSORD_CLIENT_BINDINGS_H */
