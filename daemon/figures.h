/*
 * The daemon's figures (figures.def) and the collector that reads them.
 *
 * figures_collect() reads every row of the table, from the registry, the
 * per-uid shares, the host pool and slabs, the backends, the connections
 * and the counters, into a set of samples, applying once the rule of who
 * may see what: per-uid rows are root's to see, or one's own. The front
 * ends render a set: the Prometheus text (prometheus.c) and the Stats reply
 * (reply.c). Everything here runs on the loop thread.
 */
#ifndef TENSORD_FIGURES_H
#define TENSORD_FIGURES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/memory/pool.h"
#include "daemon/persist/state.h"

struct server;

enum figure_id {
#define FIGURE(name, type, scope, unit, read, help) FIG_##name,
#define SERIES(name, type, scope, unit, emit, labels, help) FIG_##name,
#include "figures.def"
#undef FIGURE
#undef SERIES
	FIG_COUNT,
};

enum figure_type { FIGURE_COUNTER, FIGURE_GAUGE, FIGURE_HISTOGRAM };
enum figure_scope { FIGURE_DAEMON, FIGURE_DEVICE, FIGURE_UID };
enum figure_unit { FIGURE_NUMBER, FIGURE_BYTES, FIGURE_SECONDS };

/* Labels of one sample at most: the scope's (three for a device), then the figure's own. */
#define FIGURE_LABELS_MAX 5
/* Bytes of one label value, NUL included; longer values are cut. */
#define FIGURE_VALUE_MAX 64

struct figures_ctx;
struct figure;

/* One row of the table. */
struct figure {
	enum figure_id id;
	const char *name; /* "host_pool_hits_total" */
	enum figure_type type;
	enum figure_scope scope;
	enum figure_unit unit;
	const char *help;
	unsigned n_labels;                     /* the scope's and its own */
	const char *labels[FIGURE_LABELS_MAX]; /* label names, in order */
	void (*read)(struct figures_ctx *x, const struct figure *f);
};

extern const struct figure figures[FIG_COUNT];

/* One sample: a value and its label values. */
struct figure_sample {
	enum figure_id id;
	char values[FIGURE_LABELS_MAX][FIGURE_VALUE_MAX]; /* one per label of the figure */
	double value;                                     /* a histogram: the sum observed */
	/* A histogram's buckets, borrowed from the counters (valid until the
	 * loop runs again): n_bounds upper bounds, +Inf not among them, and
	 * n_bounds + 1 counts per bucket, not cumulative. */
	unsigned n_bounds;
	const double *bounds;
	const uint64_t *counts;
};

/* What one collect read. */
struct figure_set {
	struct figure_sample *v; /* owned; in table order, then as each row emitted them */
	size_t n, cap;
	/* absent[id]: not shown at all (hidden from this reader, or unknown
	 * here); a present figure may have no sample (no device, no uid). */
	bool absent[FIG_COUNT];
	bool lost; /* out of memory: some samples are missing */
};

/* Who reads: a uid, or the HTTP endpoint (no peer to ask). */
#define FIGURES_VIEW_ALL (-1)  /* every uid's rows (--metrics-per-uid) */
#define FIGURES_VIEW_NONE (-2) /* no per-uid rows at all */

/* What a row's read sees (figures.def's x). */
struct figures_ctx {
	const struct server *srv;
	int64_t viewer;
	struct figure_set *set;
	uint64_t now_ns;
	uint32_t pid;
	uint32_t open_fds;
	struct pool_stats pool;
	uint32_t slabs;
	uint64_t slab_bytes;
	struct state_figures state; /* restart survival (daemon/persist/state.h) */
};

/*
 * Reads every figure of srv as viewer (a uid, FIGURES_VIEW_ALL or
 * FIGURES_VIEW_NONE) may see it into *set, which the caller releases with
 * figures_release(). Never fails: out of memory, samples are left out and
 * set->lost says so.
 */
void figures_collect(const struct server *srv, int64_t viewer, struct figure_set *set);

void figures_release(struct figure_set *set);

/*
 * The figure's counter (figures.def's COUNTED): n more. Kept by metrics.c
 * with the other counters, so a module that counts links metrics.c alone,
 * not the collector.
 */
void figure_count(enum figure_id id, uint64_t n);

/* Descriptors this process holds, counted without allocating; 0 if unknown. */
uint32_t daemon_open_fds(void);

#endif
