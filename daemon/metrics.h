/*
 * Metrics: counters kept where things happen, and the Prometheus text
 * exposition (format 0.0.4) of them and of the daemon's state. The text is
 * written here by hand: it is a few lines of "name{labels} value", and the
 * only Prometheus client library Debian packages for C-family code
 * (prometheus-cpp) is C++ and brings its own HTTP server thread; none fits
 * a C daemon on one libuv loop (docs/operating.md says more).
 *
 * The counters are one set per process (the daemon has one loop thread and
 * one of everything); everything here runs on that thread.
 */
#ifndef TENSORD_METRICS_H
#define TENSORD_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct registry;
struct server;

/* Request kinds counted: the Request.body field numbers below this. */
#define METRICS_KINDS 32
/* Errors counted by errno value below this; larger ones count as the last. */
#define METRICS_ERRNOS 134
/* Attach latency buckets (upper bounds, nanoseconds), not counting +Inf. */
#define METRICS_ATTACH_BUCKETS 12

extern const uint64_t metrics_attach_bounds_ns[METRICS_ATTACH_BUCKETS];

/*
 * A request of this kind (Request.body_case) was decoded, or a frame that
 * was none (0: malformed, unknown, or broken framing). An attach is timed
 * from here (metrics_attach_served()).
 */
void metrics_request(unsigned kind);

/*
 * A status reply went out for a request of kind (0: none could be
 * decoded); status < 0 counts as an error of that kind. reply_status()
 * calls it (reply_on_status, set by main.c), for replies sent at once and
 * for those sent later (a GPU create's, a woken attach's, a failed export's).
 */
void metrics_reply_status(unsigned kind, int status);

/* A connection was accepted. */
void metrics_connection(void);

/* An attach was parked until its name is published. */
void metrics_attach_parked(void);

/*
 * A parked attach is being answered: it becomes the current request, and
 * its latency is measured from now (the wait is not counted).
 */
void metrics_attach_woken(void);

/*
 * The current attach got its lease and its reply is queued: observes the
 * time since its request was decoded (or, for a parked one, woken).
 */
void metrics_attach_served(void);

/* The bucket of a duration: 0 .. METRICS_ATTACH_BUCKETS (the last is +Inf). */
unsigned metrics_attach_bucket(uint64_t ns);

/* Work counted for the loop's sake: entries a request visited. */
enum metrics_visits {
	METRICS_VISITS_LEASE_LIST, /* lease slots and connections, for LeaseList */
	METRICS_VISITS_METRICS,    /* device and owner rows, for a scrape */
	METRICS_VISITS_KINDS,
};

/* A request of kind what visited n entries. */
void metrics_visits(enum metrics_visits what, uint64_t n);

/*
 * From now on the figures by device and state and by owner uid are kept as
 * reg's tensors change (registry.h, on_figures), so a scrape never walks
 * the tensors. Call once, before reg has any tensor; reg must outlive the
 * process's scrapes.
 */
void metrics_keep_figures(struct registry *reg);

/*
 * The exposition text of srv's state and the counters, as the HTTP
 * endpoint serves it: the per-uid families only with --metrics-per-uid
 * (cfg.metrics_per_uid), since anyone who reaches the endpoint reads it.
 * On success *ret is malloc'ed and NUL-terminated, owned by the caller
 * (free()), and *ret_len its length. 0 or -ENOMEM.
 */
int metrics_render(const struct server *srv, char **ret, size_t *ret_len);

/*
 * Answers a Metrics request on c with the text of srv as c's uid may see
 * it: the rule of stats, so per-uid rows are root's to see, or one's own.
 */
struct conn;
void metrics_reply(struct conn *c, uint64_t req_id, const struct server *srv);

#endif
