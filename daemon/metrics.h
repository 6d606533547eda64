/*
 * Metrics: the counters kept where things happen (requests and error
 * replies by kind, the attach latency histogram, inspection's visits) and
 * the figures of the registry's tensors (by device and state, by owner
 * uid), kept as tensors come, change state and go; and the counters of
 * the figures that are counted where things happen (figure_count()). A leaf: it reads
 * nothing else; the collector (figures.c) reads it, and the front ends
 * render what the collector read.
 *
 * The counters are one set per process (the daemon has one loop thread and
 * one of everything); everything here runs on that thread.
 */
#ifndef TENSORD_METRICS_H
#define TENSORD_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "figures.h"

struct registry;

/* Request kinds counted: the Request.body field numbers below this. */
#define METRICS_KINDS 32
/* Errors counted by errno value below this; larger ones count as the last. */
#define METRICS_ERRNOS 134
/* Attach latency buckets (upper bounds), not counting +Inf. */
#define METRICS_ATTACH_BUCKETS 12
/* Tensor states counted (tensord_state: 1 created, 2 published, 3 unlinked). */
#define METRICS_STATES 4
/* Device slots counted (the registry's, REGISTRY_DEVICES_MAX). */
#define METRICS_DEVICES 16

/* Work counted for the loop's sake: entries a request visited. */
enum metrics_visits {
	METRICS_VISITS_LEASE_LIST, /* lease slots and connections, for LeaseList */
	METRICS_VISITS_METRICS,    /* device and uid rows, for a scrape or stats */
	METRICS_VISITS_KINDS,
};

/* What one owner uid has: its tensors and their bytes, all devices. */
struct metrics_owner {
	uint32_t uid;
	uint64_t tensors, bytes;
};

/* The counters, read-only outside metrics.c. */
struct metrics {
	uint64_t requests[METRICS_KINDS];
	uint64_t errors[METRICS_KINDS][METRICS_ERRNOS];
	uint64_t attach_buckets[METRICS_ATTACH_BUCKETS + 1]; /* per bucket, +Inf last */
	uint64_t attach_count, attach_sum_ns;
	uint64_t visits[METRICS_VISITS_KINDS];
	uint64_t counted[FIG_COUNT]; /* figures.def's COUNTED: figure_count() */
	/* The registry's tensors, kept through its on_figures hook. */
	uint64_t by_state[METRICS_DEVICES][METRICS_STATES]; /* [device slot][tensord_state] */
	const struct metrics_owner *owners; /* sorted by uid; rows of 0 tensors kept */
	size_t n_owners;
	bool owners_lost; /* an owner could not be counted (out of memory) */
};

extern const struct metrics *const metrics;

/* Upper bounds of the attach latency buckets, in nanoseconds and in seconds. */
extern const uint64_t metrics_attach_bounds_ns[METRICS_ATTACH_BUCKETS];
extern const double metrics_attach_bounds_s[METRICS_ATTACH_BUCKETS];

/*
 * A request of this kind (Request.body_case) was decoded, or a frame that
 * was none (0: malformed, unknown, or broken framing). An attach is timed
 * from here (metrics_attach_served()).
 */
void metrics_request(unsigned kind);

/*
 * A status reply went out for a request of kind (0: none could be
 * decoded); status < 0 counts as an error of that kind. reply_status()
 * calls it (reply_on_status, set by server.c), for replies sent at once and
 * for those sent later (a GPU create's, a woken attach's, a failed export's).
 */
void metrics_reply_status(unsigned kind, int status);

/* A parked attach is being answered: its latency is measured from now (the wait is not counted). */
void metrics_attach_woken(void);

/*
 * The current attach got its lease and its reply is queued: observes the
 * time since its request was decoded (or, for a parked one, woken).
 */
void metrics_attach_served(void);

/* The bucket of a duration: 0 .. METRICS_ATTACH_BUCKETS (the last is +Inf). */
unsigned metrics_attach_bucket(uint64_t ns);

/* A request of kind what visited n entries. */
void metrics_visits(enum metrics_visits what, uint64_t n);

/*
 * From now on the figures by device and state and by owner uid are kept as
 * reg's tensors change (registry.h, on_figures), so a scrape never walks
 * the tensors. Call once, before reg has any tensor; reg must outlive the
 * process's scrapes.
 */
void metrics_keep_figures(struct registry *reg);

#endif
