/*
 * Outliving the daemon (docs/restart.md): the published tensors' memory
 * kept in the service manager's file descriptor store, and a state log
 * from which a restarted daemon puts them back, byte for byte, with their
 * generations and commit ids.
 *
 * While it runs, every host tensor published with a persistent lifetime
 * has its memory (one descriptor per memfd, slab or set allocation, not
 * per tensor) stored under "tm.<dev>.<ino>" before the publish is
 * answered, and a record of it appended to the state log, a memfd stored
 * as "tensord-state.<n>". A record is whole and checked (CRC-32) or
 * ignored with everything after it. When the last name in a piece of
 * memory goes, it is removed from the store (FDSTOREREMOVE).
 *
 * At start, given what the store passed back (LISTEN_FDS), the newest
 * whole log is replayed: every tensor it names whose memory came back is
 * restored before the daemon serves; the rest (memory nothing names, older
 * logs) is removed from the store.
 */
#ifndef TENSORD_STATE_H
#define TENSORD_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/registry/registry.h"

struct state;
struct seqs;

/* What stats and the metrics endpoint show of it. */
struct state_figures {
	bool on;                   /* the store is in use */
	uint64_t restored_tensors; /* put back at start */
	uint64_t restored_bytes;
	uint64_t dropped;     /* records or memory refused at start, each logged */
	uint64_t stored;      /* descriptors in the store now: memory and the log */
	uint64_t unprotected; /* published tensors that would not survive a restart now */
	uint64_t log_bytes;   /* of the current state log */
	uint64_t compactions;
};

/* At most this many bytes of log before it is rewritten whole (--state-log-size's default). */
#define STATE_LOG_DEFAULT (16ull << 20)

/*
 * Starts keeping state with at most max_fds descriptors in the store (0:
 * off), restoring first what the service manager passed (sdnotify_passed()),
 * and takes every passed descriptor that is state or memory. log_max:
 * rewrite the log past it. *ret is NULL when off. 0, or -errno with the
 * reason (the daemon does not start: it could not keep what it promised).
 * seqs (borrowed, NULL: none): what clients' requests did, restored from
 * the log and logged with each step from then on (seqs.h).
 */
int state_start(struct state **ret, struct registry *reg, uint64_t max_fds, uint64_t log_max,
		struct seqs *seqs, char *why, size_t why_len);

/*
 * A commit step's changes (registry.on_commit, before anyone hears of
 * them or a reply is sent): memory stored, a record appended, memory no
 * name is in any more removed. NULL-safe.
 */
void state_on_commit(struct state *st, const struct reg_change *v, size_t n, bool lost);

/*
 * t, a version the log holds as retired (ENTRY_RETIRED: it lost its name
 * while leased), is being freed, its last lease ended
 * (registry.on_retired_gone): its end is appended before its memory is
 * freed or reused. NULL-safe.
 */
void state_on_retired_gone(struct state *st, const struct tensor *t);

/*
 * After every commit step of a loop iteration is recorded: memory the
 * daemon freed leaves the store. NULL-safe.
 */
void state_flush(struct state *st);

/*
 * Shutdown has begun: what is unlinked or freed from now on is not
 * recorded, so the store keeps every tensor for the next start. NULL-safe.
 */
void state_freeze(struct state *st);

/*
 * Stops keeping state (shutdown: what the daemon frees from now on is not
 * unpublished, so the store keeps it for the next start) and frees st.
 */
void state_stop(struct state *st);

/* The stored listening sockets' names: the clients' one, and --peer-listen's (a prefix). */
#define STATE_LISTEN_NAME "tensord-listen"
#define STATE_PEER_LISTEN_PREFIX "tensord-peer-listen"

/*
 * Stores a listening socket fd the daemon bound itself under name (one of
 * the above; a socket that came back from the store stays stored): the
 * next daemon listens on it, and connections made meanwhile wait in its
 * backlog. 0 or -errno (-ENOSPC: one store entry must stay free for the
 * log's successor).
 */
int state_store_socket(struct state *st, int fd, const char *name);

/* Removes a stored socket the daemon does not listen on any more (FDSTOREREMOVE). */
void state_unstore_socket(struct state *st, const char *name);

/* The lineage of the state (HelloReply.lineage): kept across restarts that restore it. */
uint64_t state_lineage(const struct state *st);

/* Where st keeps its figures, read live (figures.c); NULL for NULL. */
const struct state_figures *state_figures_live(const struct state *st);

#endif
