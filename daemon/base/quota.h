/*
 * Per-uid fair shares: what each uid holds (connections, tensors, bytes,
 * parked attaches, descriptors in flight) and the limits it may not pass.
 * A leaf module: no sockets, no loop, no registry. The transport charges
 * connections and descriptors in flight, the registry tensors and bytes,
 * dispatch the waiters; each undoes its own charge. See docs/design.md,
 * "Fair shares and bounds".
 */
#ifndef TENSORD_QUOTA_H
#define TENSORD_QUOTA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QUOTA_EXEMPT_MAX 16
/* Bytes of queued watch events one uid may hold by default (16 MiB). */
#define QUOTA_WATCH_BYTES_DEFAULT (16ull << 20)
/* Tensors one uid may own by default: bounds the table memory it takes. */
#define QUOTA_TENSORS_DEFAULT (1u << 20)

/* QUOTA_CLIENTS, QUOTA_TENSORS, ...: one per row of quota.def. */
enum quota_kind {
#define QUOTA(kind, flag, arg, usage, figure, unit, what, err, help) QUOTA_##kind,
#include "quota.def"
#undef QUOTA
	QUOTA_KINDS,
};

/* What one uid holds. */
struct uid_usage {
	uint32_t uid;
	bool used;               /* slot taken (uid 0 is a real uid) */
	uint64_t n[QUOTA_KINDS]; /* indexed by enum quota_kind */
};

struct quota_limits {
	uint64_t per_uid[QUOTA_KINDS]; /* 0: no limit */
	uint32_t waiters_per_conn;
	uint32_t fds_in_flight_per_conn;
	uint32_t exempt[QUOTA_EXEMPT_MAX];
	unsigned n_exempt;
	unsigned fd_budget;  /* RLIMIT_NOFILE as the daemon runs */
	unsigned fd_reserve; /* descriptor numbers >= budget - reserve: root only */
};

struct quota {
	struct quota_limits lim;
	struct uid_usage *slots; /* open addressing, power of two */
	size_t n_slots, n_used;
};

/*
 * Fills the defaults that depend on the descriptor budget and max_clients
 * for every limit still 0 (bytes stays 0: off). fd_budget is RLIMIT_NOFILE.
 * Tensors: QUOTA_TENSORS_DEFAULT; tensors with a descriptor of their own
 * (QUOTA_FDS): half the budget less the reserve, so one uid cannot take
 * the table.
 */
void quota_default_limits(struct quota_limits *lim, unsigned fd_budget, unsigned max_clients);

void quota_init(struct quota *q, const struct quota_limits *lim);

/* lim's per-uid limits in words, for the log: "1024 connections, ..., no limit on bytes". */
void quota_describe(const struct quota_limits *lim, char *buf, size_t len);
void quota_fini(struct quota *q);

bool quota_exempt(const struct quota *q, uint32_t uid);

/*
 * Counts n more of kind for uid. 0, or, over the limit of a uid that is
 * not exempt, -EDQUOT (clients, tensors, bytes) or -EAGAIN (waiters,
 * descriptors in flight) with a message naming the limit and its flag in
 * why; nothing is counted then. -ENOMEM if the table cannot grow.
 */
int quota_charge(struct quota *q, uint32_t uid, enum quota_kind kind, uint64_t n, char *why,
		 size_t why_len);

/* Whether n more of kind would pass, without counting them. */
bool quota_room(struct quota *q, uint32_t uid, enum quota_kind kind, uint64_t n);

/*
 * Counts n more of kind for uid whatever its limit: for what a uid comes
 * to hold without asking (an unlinked tensor it leases). A later charge of
 * that kind is refused while it is over. Nothing is counted if the table
 * cannot grow.
 */
void quota_add(struct quota *q, uint32_t uid, enum quota_kind kind, uint64_t n);

/* Undoes quota_charge() of n (never below 0). */
void quota_uncharge(struct quota *q, uint32_t uid, enum quota_kind kind, uint64_t n);

/* What uid holds, or NULL if it never held anything. Borrowed until the next
 * charge. */
const struct uid_usage *quota_get(const struct quota *q, uint32_t uid);

/*
 * Calls fn for every uid that holds something, in table order. Used by
 * stats.
 */
void quota_each(const struct quota *q, void (*fn)(const struct uid_usage *u, void *arg), void *arg);

/*
 * Whether the daemon may open one more descriptor for uid: the lowest
 * free descriptor number (which the kernel hands out next) must stay below
 * budget - reserve unless uid is root or exempt. One fcntl and one close.
 */
bool quota_fd_room(const struct quota *q, uint32_t uid);

#endif
