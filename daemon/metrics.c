/*
 * Metrics: the counters (bumped by dispatch.c and reply.c as requests come
 * and go) and the figures of the registry's tensors (kept as tensors come,
 * change state and go, through the registry's on_figures hook), so that
 * reading them walks series (devices, owner uids, request kinds), never
 * tensors or connections: a scrape's cost does not grow with what the
 * clients hold, so scrapers cannot stall the loop.
 *
 * Attach latency is the daemon's own time: from decoding the Attach
 * request to queueing the reply with the lease. An attach that waited for
 * a publish is measured from the publish that woke it; the wait itself is
 * not in the histogram (attach_waits_total counts such attaches).
 */
#include "metrics.h"

#include <stdlib.h>
#include <string.h>

#include "daemon/base/log.h"
#include "proto/tensord.pb-c.h"
#include "daemon/registry/registry.h"
#include "server.h"

_Static_assert(REGISTRY_DEVICES_MAX <= METRICS_DEVICES, "a device slot without its figures");

const uint64_t metrics_attach_bounds_ns[METRICS_ATTACH_BUCKETS] = {
	5000,   10000,   25000,   50000,    100000,    250000,
	500000, 1000000, 2500000, 10000000, 100000000, 1000000000,
};
const double metrics_attach_bounds_s[METRICS_ATTACH_BUCKETS] = {
	5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 1e-1, 1,
};

static struct metrics m;
const struct metrics *const metrics = &m;

static uint64_t attach_start_ns;     /* when the attach being served was decoded (or woken) */
static struct metrics_owner *owners; /* m.owners, writable */
static size_t cap_owners;

void metrics_request(unsigned kind)
{
	if (kind >= METRICS_KINDS)
		kind = 0;
	/* Only attaches (and attach_many's members) are timed: other requests need no clock read. */
	if (kind == TENSORD__REQUEST__BODY_ATTACH || kind == TENSORD__REQUEST__BODY_ATTACH_MANY)
		attach_start_ns = now_ns();
	m.requests[kind]++;
}

void metrics_reply_status(unsigned kind, int status)
{
	unsigned e = status < 0 ? (unsigned)-status : 0;

	if (kind >= METRICS_KINDS)
		kind = 0;
	if (status < 0)
		m.errors[kind][e < METRICS_ERRNOS ? e : METRICS_ERRNOS - 1]++;
}

void metrics_attach_woken(void)
{
	attach_start_ns = now_ns();
}

unsigned metrics_attach_bucket(uint64_t ns)
{
	unsigned b = 0;

	while (b < METRICS_ATTACH_BUCKETS && ns > metrics_attach_bounds_ns[b])
		b++;
	return b;
}

void metrics_attach_served(void)
{
	uint64_t ns = now_ns() - attach_start_ns;

	m.attach_buckets[metrics_attach_bucket(ns)]++;
	m.attach_count++;
	m.attach_sum_ns += ns;
}

void figure_count(enum figure_id id, uint64_t n)
{
	m.counted[id] += n;
}

void metrics_visits(enum metrics_visits what, uint64_t n)
{
	m.visits[what] += n;
}

/* --- the figures of the registry's tensors ---------------------------------------- */

/* uid's row, made when add is set and it has none. NULL: none, or out of memory. */
static struct metrics_owner *owner_of(uint32_t uid, bool add)
{
	size_t lo = 0, hi = m.n_owners;

	/* A few dozen uids: a binary search, and a move when a new one comes. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (owners[mid].uid == uid)
			return &owners[mid];
		if (owners[mid].uid < uid)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (!add)
		return NULL;
	if (m.n_owners == cap_owners) {
		size_t cap = cap_owners ? 2 * cap_owners : 16;
		struct metrics_owner *nv = realloc(owners, cap * sizeof(*nv));

		if (!nv)
			return NULL;
		owners = nv;
		m.owners = nv;
		cap_owners = cap;
	}
	memmove(&owners[lo + 1], &owners[lo], (m.n_owners - lo) * sizeof(*owners));
	owners[lo] = (struct metrics_owner){ .uid = uid };
	m.n_owners++;
	return &owners[lo];
}

/* registry.h, on_figures: t goes from state `from` to `to` (0: not counted). */
static void on_figures(void *ctx, const struct tensor *t, int from, int to, int64_t bytes)
{
	const struct registry *reg = ctx;
	struct metrics_owner *o;

	if (t->dev) {
		uint64_t *row = m.by_state[t->dev - reg->devices];

		if (from)
			row[(unsigned)from < METRICS_STATES ? from : 0]--;
		if (to)
			row[(unsigned)to < METRICS_STATES ? to : 0]++;
	}
	o = owner_of(t->owner_uid, to && !from);
	if (!o) {
		if (to && !from && !m.owners_lost)
			log_error("metrics: out of memory counting uid %u: uid_owned_bytes is "
				  "incomplete from now on",
				  t->owner_uid);
		m.owners_lost = m.owners_lost || (to && !from);
		return;
	}
	o->tensors += (uint64_t)(to != 0) - (uint64_t)(from != 0);
	o->bytes += (uint64_t)bytes;
}

void metrics_keep_figures(struct registry *reg)
{
	reg->on_figures = on_figures;
	reg->on_figures_ctx = reg;
}
