/*
 * The collector: every row of figures.def read into a set of samples, as
 * one reader may see them. Rows read what the daemon keeps anyway (totals
 * of the registry, the connections, the pool) and the counters of
 * metrics.c; none walks tensors or connections, so a collect costs
 * O(devices + uids + request kinds + peers) whatever the clients hold.
 *
 * Who sees what is decided here and only here: per-uid rows are shown to
 * root and to the uid itself; the HTTP endpoint, which has no peer to ask,
 * shows every uid's rows with --metrics-per-uid and none without.
 */
#include "figures.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <tensord/tensord.h>

#include "daemon/memory/backend.h"
#include "daemon/memory/memlimit.h"
#include "metrics.h"
#include "daemon/remote/peer.h"
#include "proto/tensord.pb-c.h"
#include "server.h"

/* --- samples ---------------------------------------------------------------------- */

/* A new sample of f, zeroed but for its figure; NULL when out of memory (set->lost). */
static struct figure_sample *sample(struct figures_ctx *x, const struct figure *f)
{
	struct figure_set *s = x->set;

	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 128;
		struct figure_sample *nv = realloc(s->v, cap * sizeof(*nv));

		if (!nv) {
			s->lost = true;
			return NULL;
		}
		s->v = nv;
		s->cap = cap;
	}
	memset(&s->v[s->n], 0, sizeof(s->v[0]));
	s->v[s->n].id = f->id;
	return &s->v[s->n++];
}

/* Label value i of p: v, cut to FIGURE_VALUE_MAX - 1 bytes. */
static void label(struct figure_sample *p, unsigned i, const char *v)
{
	snprintf(p->values[i], sizeof(p->values[i]), "%s", v);
}

static void emit(struct figures_ctx *x, const struct figure *f, double v)
{
	struct figure_sample *p = sample(x, f);

	if (p)
		p->value = v;
}

/* A sample of device d's row: its labels device, backend, path, then what the caller adds. */
static struct figure_sample *device_sample(struct figures_ctx *x, const struct figure *f,
					   const struct reg_device *d)
{
	struct figure_sample *p = sample(x, f);
	char name[32];

	if (!p)
		return NULL;
	label(p, 0, tensord_device_name(d->device, name, sizeof(name)));
	label(p, 1, d->ops->name);
	label(p, 2, d->ops->path(d->device.device_id));
	return p;
}

static void emit_device(struct figures_ctx *x, const struct figure *f, const struct reg_device *d,
			double v)
{
	struct figure_sample *p = device_sample(x, f, d);

	if (p)
		p->value = v;
}

static bool may_see(int64_t viewer, uint32_t uid)
{
	return viewer == FIGURES_VIEW_ALL || viewer == 0 || viewer == (int64_t)uid;
}

static void emit_uid(struct figures_ctx *x, const struct figure *f, uint32_t uid, double v)
{
	struct figure_sample *p = sample(x, f);

	if (!p)
		return;
	snprintf(p->values[0], sizeof(p->values[0]), "%u", uid);
	p->value = v;
}

/* --- rows with one value per scope row ------------------------------------------------- */

#define COUNTED metrics->counted[f->id]

#define READ_DAEMON(expr) emit(x, f, (double)(expr))
#define READ_DEVICE(expr)                                                                          \
	for (int i_ = 0; i_ < x->srv->reg.n_devices; i_++) {                                       \
		const struct reg_device *d = &x->srv->reg.devices[i_];                             \
                                                                                                   \
		if (d->init_rc == 0)                                                               \
			emit_device(x, f, d, (double)(expr));                                      \
	}
#define READ_UID(expr)                                                                             \
	for (size_t i_ = 0; i_ < x->srv->quota.n_slots; i_++) {                                    \
		const struct uid_usage *u = &x->srv->quota.slots[i_];                              \
                                                                                                   \
		if (u->used && may_see(x->viewer, u->uid))                                         \
			emit_uid(x, f, u->uid, (double)(expr));                                    \
	}

#define FIGURE(name, type, scope, unit, read, help)                                                \
	static void read_##name(struct figures_ctx *x, const struct figure *f)                     \
	{                                                                                          \
		READ_##scope(read);                                                                \
	}
#define SERIES(name, type, scope, unit, emit, labels, help)                                        \
	static void emit(struct figures_ctx *x, const struct figure *f);
#include "figures.def"
#undef FIGURE
#undef SERIES

/* --- series: samples with labels of their own ------------------------------------------ */

/* The name of a request kind: the Request.body field's, "invalid" for 0. */
static const char *kind_name(unsigned kind)
{
	const ProtobufCFieldDescriptor *fd =
		kind ? protobuf_c_message_descriptor_get_field(&tensord__request__descriptor, kind)
		     : NULL;

	return fd && (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) ? fd->name : "invalid";
}

static void emit_requests(struct figures_ctx *x, const struct figure *f)
{
	for (unsigned k = 0; k < METRICS_KINDS; k++) {
		struct figure_sample *p;

		if (k != 0 && strcmp(kind_name(k), "invalid") == 0)
			continue;
		p = sample(x, f);
		if (!p)
			return;
		label(p, 0, kind_name(k));
		p->value = (double)metrics->requests[k];
	}
}

static void emit_errors(struct figures_ctx *x, const struct figure *f)
{
	for (unsigned k = 0; k < METRICS_KINDS; k++)
		for (unsigned e = 1; e < METRICS_ERRNOS; e++) {
			const char *n = tensord_err_name((int)e);
			struct figure_sample *p;

			if (!metrics->errors[k][e] || !(p = sample(x, f)))
				continue;
			label(p, 0, kind_name(k));
			/* Its name, or "E<number>" for an errno without one. */
			if (strcmp(n, "EUNKNOWN") != 0)
				label(p, 1, n);
			else
				snprintf(p->values[1], sizeof(p->values[1]), "E%u", e);
			p->value = (double)metrics->errors[k][e];
		}
}

static void emit_attach_duration(struct figures_ctx *x, const struct figure *f)
{
	struct figure_sample *p = sample(x, f);

	if (!p)
		return;
	p->value = (double)metrics->attach_sum_ns / 1e9;
	p->n_bounds = METRICS_ATTACH_BUCKETS;
	p->bounds = metrics_attach_bounds_s;
	p->counts = metrics->attach_buckets;
}

static void emit_visits(struct figures_ctx *x, const struct figure *f)
{
	static const char *const what[METRICS_VISITS_KINDS] = { "lease_list", "metrics" };

	for (unsigned k = 0; k < METRICS_VISITS_KINDS; k++) {
		struct figure_sample *p = sample(x, f);

		if (!p)
			return;
		label(p, 0, what[k]);
		p->value = (double)metrics->visits[k];
	}
}

static void emit_cgroup_shmem(struct figures_ctx *x, const struct figure *f)
{
	uint64_t shmem = memlimit_shmem("");

	if (shmem == UINT64_MAX)
		x->set->absent[f->id] = true; /* the kernel does not say */
	else
		emit(x, f, (double)shmem);
}

static void emit_device_tensors(struct figures_ctx *x, const struct figure *f)
{
	static const char *const states[METRICS_STATES] = { "", "created", "published",
							    "unlinked" };

	for (int i = 0; i < x->srv->reg.n_devices; i++) {
		const struct reg_device *d = &x->srv->reg.devices[i];

		for (unsigned s = 1; s < METRICS_STATES && d->init_rc == 0; s++) {
			struct figure_sample *p = device_sample(x, f, d);

			if (!p)
				return;
			label(p, 3, states[s]);
			p->value = (double)metrics->by_state[i][s];
		}
	}
}

static void emit_owned_bytes(struct figures_ctx *x, const struct figure *f)
{
	for (size_t i = 0; i < metrics->n_owners; i++) {
		const struct metrics_owner *o = &metrics->owners[i];

		if (o->tensors && may_see(x->viewer, o->uid))
			emit_uid(x, f, o->uid, (double)o->bytes);
	}
}

/* One sample per peer, labelled with its name, of what get() reads of it. */
static void emit_peers(struct figures_ctx *x, const struct figure *f,
		       double (*get)(const struct peer *p, const struct peer_remote_counts *c))
{
	const struct peer_set *set = &x->srv->peers;

	for (unsigned i = 0; i < set->n_peers; i++) {
		const struct peer *p = set->peers[i];
		struct figure_sample *s = sample(x, f);

		if (!s)
			return;
		label(s, 0, p->name);
		s->value = get(p, &p->remote);
	}
}

static double peer_up(const struct peer *p, const struct peer_remote_counts *c)
{
	(void)c;
	return p->state == PEER_UP;
}

static double peer_pulled(const struct peer *p, const struct peer_remote_counts *c)
{
	(void)p;
	return (double)c->pulled_bytes;
}

static double peer_errors(const struct peer *p, const struct peer_remote_counts *c)
{
	(void)p;
	return (double)c->pull_errors;
}

static double peer_served(const struct peer *p, const struct peer_remote_counts *c)
{
	(void)p;
	return (double)c->served_bytes;
}

static double peer_replicas(const struct peer *p, const struct peer_remote_counts *c)
{
	(void)p;
	return (double)c->replica_bytes;
}

static void emit_peer_up(struct figures_ctx *x, const struct figure *f)
{
	emit_peers(x, f, peer_up);
}

static void emit_peer_pulled_bytes(struct figures_ctx *x, const struct figure *f)
{
	emit_peers(x, f, peer_pulled);
}

static void emit_peer_pull_errors(struct figures_ctx *x, const struct figure *f)
{
	emit_peers(x, f, peer_errors);
}

static void emit_peer_served_bytes(struct figures_ctx *x, const struct figure *f)
{
	emit_peers(x, f, peer_served);
}

static void emit_peer_replica_bytes(struct figures_ctx *x, const struct figure *f)
{
	emit_peers(x, f, peer_replicas);
}

/* --- the table -------------------------------------------------------------------------- */

#define LABELS(...) __VA_ARGS__,
#define NO_LABELS
#define SCOPE_LABELS_DAEMON
#define SCOPE_LABELS_DEVICE "device", "backend", "path",
#define SCOPE_LABELS_UID "uid",
#define N_LABELS(...) (sizeof((const char *[]){ __VA_ARGS__ NULL }) / sizeof(const char *) - 1)

const struct figure figures[FIG_COUNT] = {
#define FIGURE(name, type, scope, unit, read, help)                                                \
	[FIG_##name] = { FIG_##name,                                                               \
			 #name,                                                                    \
			 FIGURE_##type,                                                            \
			 FIGURE_##scope,                                                           \
			 FIGURE_##unit,                                                            \
			 help,                                                                     \
			 N_LABELS(SCOPE_LABELS_##scope),                                           \
			 { SCOPE_LABELS_##scope NULL },                                            \
			 read_##name },
#define SERIES(name, type, scope, unit, emit, labels, help)                                        \
	[FIG_##name] = { FIG_##name,                                                               \
			 #name,                                                                    \
			 FIGURE_##type,                                                            \
			 FIGURE_##scope,                                                           \
			 FIGURE_##unit,                                                            \
			 help,                                                                     \
			 N_LABELS(SCOPE_LABELS_##scope labels),                                    \
			 { SCOPE_LABELS_##scope labels NULL },                                     \
			 emit },
#include "figures.def"
#undef FIGURE
#undef SERIES
};

/* --- collecting ----------------------------------------------------------------------- */

void figures_collect(const struct server *srv, int64_t viewer, struct figure_set *set)
{
	struct pool *pool = backend_host_pool();
	struct figures_ctx x = {
		.srv = srv,
		.viewer = viewer,
		.set = set,
		.now_ns = now_ns(),
		.pid = (uint32_t)getpid(),
		.open_fds = daemon_open_fds(),
	};

	memset(set, 0, sizeof(*set));
	if (pool)
		pool_get_stats(pool, &x.pool);
	backend_host_slab_stats(&x.slabs, &x.slab_bytes);
	state_figures(srv->state, &x.state);
	/* Counted first, so the figure counts its own collect: the rows it walks. */
	metrics_visits(METRICS_VISITS_METRICS, (uint64_t)srv->reg.n_devices + srv->quota.n_used +
						       metrics->n_owners + srv->peers.n_peers);
	for (unsigned i = 0; i < FIG_COUNT; i++) {
		const struct figure *f = &figures[i];

		if (f->scope == FIGURE_UID && viewer == FIGURES_VIEW_NONE)
			set->absent[i] = true;
		else
			f->read(&x, f);
	}
}

void figures_release(struct figure_set *set)
{
	free(set->v);
	memset(set, 0, sizeof(*set));
}

/*
 * Descriptors this process holds. Linux 6.2 and later give the count as
 * the size of /proc/self/fd, in O(1); older kernels say 0 there, and then
 * they are counted with getdents64 into a stack buffer, which costs a pass
 * over every descriptor: stats and scrapes must not allocate, since a
 * client may ask for them in a flood. 0 if unknown.
 */
uint32_t daemon_open_fds(void)
{
	_Alignas(8) char buf[4096];
	struct stat st;
	uint32_t n = 0;
	long got;
	int dfd;

	if (stat("/proc/self/fd", &st) == 0 && st.st_size > 0)
		return (uint32_t)st.st_size;
	dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return 0;
	while ((got = syscall(SYS_getdents64, dfd, buf, sizeof(buf))) > 0) {
		for (long off = 0; off < got;) {
			struct dirent64 *e = (struct dirent64 *)(buf + off);

			n += e->d_name[0] != '.';
			off += e->d_reclen;
		}
	}
	close(dfd);
	return n ? n - 1 : 0; /* less the one counting them */
}
