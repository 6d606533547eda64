/*
 * Log rate limits (ratelimit.h): a fixed one-second window per bucket, as
 * the kernel's printk_ratelimit does, which is enough to bound what a peer
 * can write and simple to reason about. A connection's summary line goes
 * through the limit over all connections too, so that many connections
 * that each stay under their own limit cannot flood the log with
 * summaries.
 */
#include <time.h>

#include "ratelimit.h"

static const char *const kind_names[LOG_KIND_N] = {
	[LOG_KIND_BAD_RELEASE] = "release of an unknown lease",
	[LOG_KIND_BEFORE_HELLO] = "request before hello",
	[LOG_KIND_BAD_FRAME] = "malformed request",
	[LOG_KIND_REFUSED_ACCEPT] = "refused connection",
	[LOG_KIND_QUARANTINE] = "memory kept past a connection",
	[LOG_KIND_PEER_REFUSED] = "refused peer connection",
};

/* The limits over all connections, one bucket per kind. */
static struct log_bucket all[LOG_KIND_N];

uint64_t ratelimit_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Opens a new window when b's is over; returns what the old one held back. */
static uint32_t roll(struct log_bucket *b, uint64_t now)
{
	uint32_t held;

	if (b->start_ns && now - b->start_ns < RATELIMIT_WINDOW_NS)
		return 0;
	held = b->suppressed;
	b->start_ns = now;
	b->logged = 0;
	b->suppressed = 0;
	return held;
}

/* Takes one line out of b's budget of burst; counts it as held back when none is left. */
static bool take(struct log_bucket *b, uint32_t burst, uint32_t n)
{
	if (b->logged >= burst) {
		b->suppressed += n;
		return false;
	}
	b->logged++;
	return true;
}

static void roll_all(enum log_kind kind, uint64_t now)
{
	uint32_t held = roll(&all[kind], now);

	if (held)
		log_warn("suppressed %u lines of kind '%s' from all clients", held,
			 kind_names[kind]);
}

/* A connection's summary of n held-back lines, itself under the limit over all. */
static void say_held(enum log_kind kind, const struct log_peer *peer, uint32_t n, uint64_t now)
{
	roll_all(kind, now);
	if (take(&all[kind], RATELIMIT_ALL_BURST, n))
		log_warn("conn %llu: pid %u uid %u: suppressed %u lines of kind '%s'",
			 (unsigned long long)peer->conn_id, peer->pid, peer->uid, n,
			 kind_names[kind]);
}

bool ratelimit_allow(enum log_kind kind, struct log_limits *per, const struct log_peer *peer,
		     uint64_t now)
{
	if (per) {
		struct log_bucket *b = &per->kind[kind];
		uint32_t held = roll(b, now);

		if (held)
			say_held(kind, peer, held, now);
		if (!take(b, RATELIMIT_CONN_BURST, 1))
			return false;
	}
	roll_all(kind, now);
	return take(&all[kind], RATELIMIT_ALL_BURST, 1);
}

void ratelimit_flush(struct log_limits *per, const struct log_peer *peer, uint64_t now)
{
	for (int k = 0; k < LOG_KIND_N; k++) {
		if (per->kind[k].suppressed)
			say_held((enum log_kind)k, peer, per->kind[k].suppressed, now);
		per->kind[k].suppressed = 0;
	}
}

void ratelimit_flush_all(void)
{
	for (int k = 0; k < LOG_KIND_N; k++) {
		if (all[k].suppressed)
			log_warn("suppressed %u lines of kind '%s' from all clients",
				 all[k].suppressed, kind_names[k]);
		all[k].suppressed = 0;
	}
}
