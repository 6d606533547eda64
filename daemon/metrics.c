/*
 * Metrics: the counters (bumped by dispatch.c and reply.c as requests come
 * and go), the figures of the registry's tensors (kept as tensors come, change
 * state and go, through the registry's on_figures hook), and the exposition
 * text, built when asked (a scrape or a Metrics request) from those and from
 * totals the daemon keeps anyway. A scrape walks series (devices, owner uids,
 * request kinds), never tensors or connections: its cost does not grow with
 * what the clients hold, so scrapers cannot stall the loop.
 *
 * Attach latency is the daemon's own time: from decoding the Attach
 * request to queueing the reply with the lease. An attach that waited for
 * a publish is measured from the publish that woke it; the wait itself is
 * not in the histogram (tensord_attach_waits_total counts such attaches).
 *
 * Who sees what: per-uid rows (tensord_owner_*) follow the rule of stats,
 * root sees every uid, others their own; the HTTP endpoint has no peer to
 * ask, so it shows them only when the operator says so (--metrics-per-uid).
 */
#include "metrics.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dispatch.h"
#include "log.h"
#include "memlimit.h"
#include "pool.h"
#include "proto/tensord.pb-c.h"
#include "reply.h"
#include "server.h"

const uint64_t metrics_attach_bounds_ns[METRICS_ATTACH_BUCKETS] = {
	5000,   10000,   25000,   50000,    100000,    250000,
	500000, 1000000, 2500000, 10000000, 100000000, 1000000000,
};

static struct {
	unsigned cur_kind;     /* the request being served */
	uint64_t cur_start_ns; /* when it was decoded (or woken) */
	uint64_t requests[METRICS_KINDS];
	uint64_t errors[METRICS_KINDS][METRICS_ERRNOS];
	uint64_t connections;
	uint64_t attach_waits;
	uint64_t attach_buckets[METRICS_ATTACH_BUCKETS + 1];
	uint64_t attach_count, attach_sum_ns;
	uint64_t visits[METRICS_VISITS_KINDS];
} m;

/* What one owner uid has: a row of tensord_owner_*. */
struct owner {
	uint32_t uid;
	uint64_t tensors, bytes;
};

/* The figures of the registry's tensors, kept by on_figures(). */
static struct {
	uint64_t by_state[REGISTRY_DEVICES_MAX][4]; /* [device slot][tensord_state] */
	struct owner *owners;                       /* sorted by uid; never shrinks */
	size_t n_owners, cap_owners;
	bool lost; /* an owner could not be counted (out of memory) */
} fig;

void metrics_request(unsigned kind)
{
	m.cur_kind = kind < METRICS_KINDS ? kind : 0;
	/* Only attaches are timed: other requests need no clock read. */
	if (kind == TENSORD__REQUEST__BODY_ATTACH)
		m.cur_start_ns = now_ns();
	m.requests[m.cur_kind]++;
}

void metrics_reply_status(unsigned kind, int status)
{
	unsigned e = status < 0 ? (unsigned)-status : 0;

	if (kind >= METRICS_KINDS)
		kind = 0;
	if (status < 0)
		m.errors[kind][e < METRICS_ERRNOS ? e : METRICS_ERRNOS - 1]++;
}

void metrics_connection(void)
{
	m.connections++;
}

void metrics_attach_parked(void)
{
	m.attach_waits++;
}

void metrics_attach_woken(void)
{
	m.cur_kind = TENSORD__REQUEST__BODY_ATTACH;
	m.cur_start_ns = now_ns();
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
	uint64_t ns = now_ns() - m.cur_start_ns;

	m.attach_buckets[metrics_attach_bucket(ns)]++;
	m.attach_count++;
	m.attach_sum_ns += ns;
}

void metrics_visits(enum metrics_visits what, uint64_t n)
{
	m.visits[what] += n;
}

/* --- the figures ----------------------------------------------------------------- */

/* uid's row, made when add is set and it has none. NULL: none, or out of memory. */
static struct owner *owner_of(uint32_t uid, bool add)
{
	size_t lo = 0, hi = fig.n_owners;

	/* A few dozen uids: a binary search, and a move when a new one comes. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (fig.owners[mid].uid == uid)
			return &fig.owners[mid];
		if (fig.owners[mid].uid < uid)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (!add)
		return NULL;
	if (fig.n_owners == fig.cap_owners) {
		size_t cap = fig.cap_owners ? 2 * fig.cap_owners : 16;
		struct owner *nv = realloc(fig.owners, cap * sizeof(*nv));

		if (!nv)
			return NULL;
		fig.owners = nv;
		fig.cap_owners = cap;
	}
	memmove(&fig.owners[lo + 1], &fig.owners[lo], (fig.n_owners - lo) * sizeof(*fig.owners));
	fig.owners[lo] = (struct owner){ .uid = uid };
	fig.n_owners++;
	return &fig.owners[lo];
}

/* registry.h, on_figures: t goes from state `from` to `to` (0: not counted). */
static void on_figures(void *ctx, const struct tensor *t, int from, int to, int64_t bytes)
{
	const struct registry *reg = ctx;
	struct owner *o;

	if (t->dev) {
		uint64_t *row = fig.by_state[t->dev - reg->devices];

		if (from)
			row[(unsigned)from < 4 ? from : 0]--;
		if (to)
			row[(unsigned)to < 4 ? to : 0]++;
	}
	o = owner_of(t->owner_uid, to && !from);
	if (!o) {
		if (to && !from && !fig.lost)
			log_error("metrics: out of memory counting uid %u: tensord_owner_* are "
				  "incomplete from now on",
				  t->owner_uid);
		fig.lost = fig.lost || (to && !from);
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

/* --- the text ------------------------------------------------------------------ */

static void family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One family with one unlabelled sample. */
static void single(FILE *f, const char *name, const char *type, const char *help, uint64_t v)
{
	family(f, name, type, help);
	fprintf(f, "%s %llu\n", name, (unsigned long long)v);
}

/* The name of a request kind: the Request.body field's, "invalid" for 0. */
static const char *kind_name(unsigned kind)
{
	const ProtobufCFieldDescriptor *fd =
		kind ? protobuf_c_message_descriptor_get_field(&tensord__request__descriptor, kind)
		     : NULL;

	return fd && (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) ? fd->name : "invalid";
}

/* The code label of errno e: its name, or "E<number>" for one without. */
static const char *code_name(unsigned e, char *buf, size_t len)
{
	const char *n = tensord_err_name((int)e);

	if (strcmp(n, "EUNKNOWN") != 0)
		return n;
	snprintf(buf, len, "E%u", e);
	return buf;
}

static void render_requests(FILE *f)
{
	char code[16];

	family(f, "tensord_requests_total", "counter",
	       "Requests decoded, by kind (invalid: malformed or unknown requests and broken "
	       "framing).");
	for (unsigned k = 0; k < METRICS_KINDS; k++)
		if (k == 0 || strcmp(kind_name(k), "invalid") != 0)
			fprintf(f, "tensord_requests_total{request=\"%s\"} %llu\n", kind_name(k),
				(unsigned long long)m.requests[k]);
	family(f, "tensord_errors_total", "counter",
	       "Error replies, by request kind and error code.");
	for (unsigned k = 0; k < METRICS_KINDS; k++)
		for (unsigned e = 1; e < METRICS_ERRNOS; e++)
			if (m.errors[k][e])
				fprintf(f,
					"tensord_errors_total{request=\"%s\",code=\"%s\"} %llu\n",
					kind_name(k), code_name(e, code, sizeof(code)),
					(unsigned long long)m.errors[k][e]);
}

static void render_attach(FILE *f)
{
	uint64_t cum = 0;

	family(f, "tensord_attach_duration_seconds", "histogram",
	       "The daemon's time to serve an attach, from decoding the request (or the publish "
	       "that woke a waiting one) to queueing the reply with the lease.");
	for (unsigned b = 0; b < METRICS_ATTACH_BUCKETS; b++) {
		cum += m.attach_buckets[b];
		fprintf(f, "tensord_attach_duration_seconds_bucket{le=\"%g\"} %llu\n",
			(double)metrics_attach_bounds_ns[b] / 1e9, (unsigned long long)cum);
	}
	fprintf(f, "tensord_attach_duration_seconds_bucket{le=\"+Inf\"} %llu\n",
		(unsigned long long)m.attach_count);
	fprintf(f, "tensord_attach_duration_seconds_sum %.9f\n", (double)m.attach_sum_ns / 1e9);
	fprintf(f, "tensord_attach_duration_seconds_count %llu\n",
		(unsigned long long)m.attach_count);
	single(f, "tensord_attach_waits_total", "counter",
	       "Attaches that waited for their tensor to be published.", m.attach_waits);
}

static const char *const state_names[] = { "unknown", "created", "published", "unlinked" };

static void render_devices(FILE *f, const struct registry *reg)
{
	char dev[32];

	family(f, "tensord_tensors", "gauge",
	       "Tensors alive (named, or unlinked and still leased), by device and state.");
	for (int i = 0; i < reg->n_devices; i++)
		for (int s = 1; s < 4 && reg->devices[i].init_rc == 0; s++)
			fprintf(f, "tensord_tensors{device=\"%s\",state=\"%s\"} %llu\n",
				tensord_device_name(reg->devices[i].device, dev, sizeof(dev)),
				state_names[s], (unsigned long long)fig.by_state[i][s]);
	family(f, "tensord_device_used_bytes", "gauge", "Bytes allocated, by device.");
	for (int i = 0; i < reg->n_devices; i++)
		if (reg->devices[i].init_rc == 0)
			fprintf(f, "tensord_device_used_bytes{device=\"%s\",backend=\"%s\"} %llu\n",
				tensord_device_name(reg->devices[i].device, dev, sizeof(dev)),
				reg->devices[i].ops->name,
				(unsigned long long)reg->devices[i].used);
	family(f, "tensord_device_capacity_bytes", "gauge",
	       "Bytes the daemon may allocate, by device.");
	for (int i = 0; i < reg->n_devices; i++)
		if (reg->devices[i].init_rc == 0)
			fprintf(f,
				"tensord_device_capacity_bytes{device=\"%s\",backend=\"%s\"} "
				"%llu\n",
				tensord_device_name(reg->devices[i].device, dev, sizeof(dev)),
				reg->devices[i].ops->name,
				(unsigned long long)reg->devices[i].capacity);
	family(f, "tensord_device_gpu_bytes", "gauge",
	       "GPU memory the daemon costs, by device: its context (as NVML counted it when "
	       "made) and its allocations; 0 when none or unknown.");
	for (int i = 0; i < reg->n_devices; i++)
		if (reg->devices[i].init_rc == 0 && reg->devices[i].ops->gpu_bytes)
			fprintf(f, "tensord_device_gpu_bytes{device=\"%s\",backend=\"%s\"} %llu\n",
				tensord_device_name(reg->devices[i].device, dev, sizeof(dev)),
				reg->devices[i].ops->name,
				(unsigned long long)reg->devices[i].ops->gpu_bytes(
					reg->devices[i].device.device_id));
}

/* Who reads the text: a uid (the rule of stats), or the HTTP endpoint. */
enum { VIEW_ALL = -1, VIEW_NONE = -2 };

static bool view_shows(int64_t viewer, uint32_t uid)
{
	return viewer == VIEW_ALL || viewer == 0 || viewer == (int64_t)uid;
}

/* Bytes and tensors per owner uid, the rows viewer may see; none for VIEW_NONE. */
static void render_owners(FILE *f, int64_t viewer)
{
	if (viewer == VIEW_NONE)
		return;
	family(f, "tensord_owner_bytes", "gauge", "Bytes allocated, by owner uid (all devices).");
	for (size_t i = 0; i < fig.n_owners; i++)
		if (fig.owners[i].tensors && view_shows(viewer, fig.owners[i].uid))
			fprintf(f, "tensord_owner_bytes{uid=\"%u\"} %llu\n", fig.owners[i].uid,
				(unsigned long long)fig.owners[i].bytes);
	family(f, "tensord_owner_tensors", "gauge", "Tensors alive, by owner uid.");
	for (size_t i = 0; i < fig.n_owners; i++)
		if (fig.owners[i].tensors && view_shows(viewer, fig.owners[i].uid))
			fprintf(f, "tensord_owner_tensors{uid=\"%u\"} %llu\n", fig.owners[i].uid,
				(unsigned long long)fig.owners[i].tensors);
}

static void render_clients(FILE *f, const struct server *srv)
{
	single(f, "tensord_clients", "gauge", "Client connections open.", srv->conns.n);
	single(f, "tensord_connections_total", "counter", "Client connections accepted.",
	       m.connections);
	single(f, "tensord_leases", "gauge", "Leases held by all clients.", srv->reg.n_leases);
	single(f, "tensord_waiters", "gauge", "Attaches waiting for a publish.",
	       srv->waiters.n_waiters);
}

static void render_host(FILE *f)
{
	struct pool *pool = backend_host_pool();
	struct pool_stats ps = { 0 };
	uint64_t slab_bytes, shmem;
	uint32_t slabs;

	if (pool)
		pool_get_stats(pool, &ps);
	backend_host_slab_stats(&slabs, &slab_bytes);
	single(f, "tensord_open_fds", "gauge", "Descriptors the daemon holds open.",
	       daemon_open_fds());
	single(f, "tensord_host_pool_fds", "gauge", "Ready memfds the host pool keeps.",
	       ps.ready_fds);
	single(f, "tensord_host_pool_bytes", "gauge", "Bytes allocated in ready memfds.",
	       ps.ready_bytes);
	single(f, "tensord_host_pool_budget_bytes", "gauge", "The most bytes the pool keeps ready.",
	       ps.budget);
	single(f, "tensord_host_pool_hits_total", "counter", "Host creates served from the pool.",
	       ps.hits);
	single(f, "tensord_host_pool_misses_total", "counter",
	       "Host creates of 1 MiB or more that found no ready memfd.", ps.misses);
	single(f, "tensord_host_slabs", "gauge", "Slab memfds shared by small immutable tensors.",
	       slabs);
	single(f, "tensord_host_slab_bytes", "gauge", "Bytes in live slab slots.", slab_bytes);
	shmem = memlimit_shmem("");
	if (shmem != UINT64_MAX)
		single(f, "tensord_host_cgroup_shmem_bytes", "gauge",
		       "Shared memory charged to the daemon's memory cgroup: its tensors and "
		       "pool, and pages of freed tensors that clients still map or hold.",
		       shmem);
}

static void render_visits(FILE *f)
{
	static const char *const what[METRICS_VISITS_KINDS] = { "lease_list", "metrics" };

	family(f, "tensord_inspect_visits_total", "counter",
	       "Entries inspection visited, by request: lease slots and connections for "
	       "lease_list, device and owner rows for metrics (work, bounded per request).");
	for (unsigned k = 0; k < METRICS_VISITS_KINDS; k++)
		fprintf(f, "tensord_inspect_visits_total{request=\"%s\"} %llu\n", what[k],
			(unsigned long long)m.visits[k]);
}

static int render(const struct server *srv, int64_t viewer, char **ret, size_t *ret_len)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f;
	int r;

	/* Counted first, so the text counts itself: the rows it walks. */
	m.visits[METRICS_VISITS_METRICS] += (uint64_t)srv->reg.n_devices + fig.n_owners;
	f = open_memstream(&text, &len);
	if (!f)
		return -ENOMEM;
	family(f, "tensord_uptime_seconds", "gauge", "Seconds since the daemon started.");
	fprintf(f, "tensord_uptime_seconds %.3f\n", (double)(now_ns() - srv->start_ns) / 1e9);
	render_clients(f, srv);
	render_devices(f, &srv->reg);
	render_owners(f, viewer);
	render_requests(f);
	render_attach(f);
	render_host(f);
	render_visits(f);
	r = ferror(f) ? -ENOMEM : 0;
	if (fclose(f) != 0 || r < 0) {
		free(text);
		return -ENOMEM;
	}
	*ret = text;
	*ret_len = len;
	return 0;
}

int metrics_render(const struct server *srv, char **ret, size_t *ret_len)
{
	return render(srv, srv->cfg.metrics_per_uid ? VIEW_ALL : VIEW_NONE, ret, ret_len);
}

void metrics_reply(struct conn *c, uint64_t req_id, const struct server *srv)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__MetricsReply mr = TENSORD__METRICS_REPLY__INIT;
	size_t len;
	char *text;

	if (render(srv, c->uid, &text, &len) < 0) {
		reply_status(c, TENSORD__REQUEST__BODY_METRICS, req_id, -ENOMEM,
			     "out of memory rendering metrics");
		return;
	}
	mr.text = text;
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_METRICS;
	rep.metrics = &mr;
	conn_send(c, &rep.base, NULL);
	free(text);
}
