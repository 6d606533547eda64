/*
 * Rate limits for log lines that a peer can cause at will (a bogus release,
 * a request before hello, a broken frame, a refused connection), so that no
 * client can fill the disk or drown other lines: per connection and kind,
 * the first RATELIMIT_CONN_BURST lines a second; per kind over all
 * connections, RATELIMIT_ALL_BURST. What is held back is counted and said
 * in one line: "suppressed K lines of kind X from conn C", when the next
 * second starts, when the connection closes, or when the daemon stops.
 */
#ifndef TENSORD_RATELIMIT_H
#define TENSORD_RATELIMIT_H

#include <stdbool.h>
#include <stdint.h>

#include "log.h"

#define RATELIMIT_CONN_BURST 5
#define RATELIMIT_ALL_BURST 50
#define RATELIMIT_WINDOW_NS 1000000000ull

enum log_kind {
	LOG_KIND_BAD_RELEASE,    /* release of a lease the client does not hold */
	LOG_KIND_BEFORE_HELLO,   /* a request before the hello */
	LOG_KIND_BAD_FRAME,      /* framing broken, bad version, undecodable request */
	LOG_KIND_REFUSED_ACCEPT, /* a connection refused (client limit, no descriptors) */
	LOG_KIND_QUARANTINE,     /* a connection ended holding legacy IPC leases */
	LOG_KIND_PEER_REFUSED,   /* a peer connection refused (handshake, framing, resolving) */
	LOG_KIND_N,
};

/* One window: how many lines went out and how many were held back. */
struct log_bucket {
	uint64_t start_ns;
	uint32_t logged, suppressed;
};

/* A connection's buckets, one per kind; zeroed at accept. */
struct log_limits {
	struct log_bucket kind[LOG_KIND_N];
};

/* Who a line is about, for the suppression summary. */
struct log_peer {
	uint64_t conn_id; /* 0: not a connection yet */
	uint32_t pid, uid;
};

/* CLOCK_MONOTONIC in nanoseconds: the clock of the windows. */
uint64_t ratelimit_now(void);

/*
 * Whether a line of kind about peer may be written now (per, the peer's
 * buckets, may be NULL: only the limit over all connections applies).
 * Writes the summary of a finished window first.
 */
bool ratelimit_allow(enum log_kind kind, struct log_limits *per, const struct log_peer *peer,
		     uint64_t now);

/* Says what per held back (a closing connection). */
void ratelimit_flush(struct log_limits *per, const struct log_peer *peer, uint64_t now);

/* Says what the limits over all connections held back (the daemon stops, SIGUSR1). */
void ratelimit_flush_all(void);

/* The level is checked first; then the limit; then the line is formatted. */
#define log_limited(level, kind, per, peer, ...)                                                   \
	do {                                                                                       \
		if ((level) <= log_level &&                                                        \
		    ratelimit_allow((kind), (per), (peer), ratelimit_now()))                       \
			log_write((level), __VA_ARGS__);                                           \
	} while (0)

#endif /* TENSORD_RATELIMIT_H */
