/*
 * What Stats answers: the figures the collector read, as Figure messages;
 * and, for clients from before figures (who do not ask for figures only),
 * the fields StatsReply had then, looked up by figure in the same set.
 * Those fields are frozen: a new figure appears only as a Figure.
 */
#include <stdlib.h>
#include <string.h>

#include <tensord/tensord.h>

#include "figures.h"
#include "proto/tensord.pb-c.h"
#include "reply.h"

/* The samples of figure id whose first label is row (NULL: any), added up. */
static double sum(const struct figure_set *set, enum figure_id id, const char *row)
{
	double v = 0;

	for (size_t i = 0; i < set->n; i++)
		if (set->v[i].id == id && (!row || strcmp(set->v[i].values[0], row) == 0))
			v += set->v[i].value;
	return v;
}

/* Storage the legacy fields point into while the reply is packed. */
struct legacy {
	Tensord__DeviceStats ds[TENSORD_STATS_DEVICES_MAX], *pds[TENSORD_STATS_DEVICES_MAX];
	Tensord__Device dev[TENSORD_STATS_DEVICES_MAX];
	Tensord__UidUsage *rows, **prows;
};

static void legacy_devices(Tensord__StatsReply *sr, const struct figure_set *set, struct legacy *l)
{
	size_t n = 0;

	for (size_t i = 0; i < set->n && n < TENSORD_STATS_DEVICES_MAX; i++) {
		const struct figure_sample *p = &set->v[i];
		const char *name = p->values[0];
		DLDevice d;

		if (p->id != FIG_device_used_bytes || tensord_device_parse(name, &d) < 0)
			continue;
		tensord__device_stats__init(&l->ds[n]);
		tensord__device__init(&l->dev[n]);
		l->dev[n].type = (uint32_t)d.device_type;
		l->dev[n].id = d.device_id;
		l->ds[n].device = &l->dev[n];
		l->ds[n].backend = (char *)p->values[1];
		l->ds[n].path = (char *)p->values[2];
		l->ds[n].bytes_used = (uint64_t)p->value;
		l->ds[n].bytes_capacity = (uint64_t)sum(set, FIG_device_capacity_bytes, name);
		l->ds[n].tensors = (uint32_t)sum(set, FIG_device_tensors, name);
		l->ds[n].gpu_bytes = (uint64_t)sum(set, FIG_device_gpu_bytes, name);
		l->pds[n] = &l->ds[n];
		n++;
	}
	sr->n_devices = n;
	sr->devices = l->pds;
}

static void legacy_uids(Tensord__StatsReply *sr, const struct figure_set *set, struct legacy *l)
{
	size_t n = 0, rows = 0;

	for (size_t i = 0; i < set->n; i++)
		rows += set->v[i].id == FIG_uid_clients;
	l->rows = rows ? malloc(rows * sizeof(*l->rows)) : NULL;
	l->prows = rows ? malloc(rows * sizeof(*l->prows)) : NULL;
	if (!l->rows || !l->prows)
		return; /* none, or out of memory: stats without the per-uid rows */
	for (size_t i = 0; i < set->n; i++) {
		const char *uid = set->v[i].values[0];
		Tensord__UidUsage *w = &l->rows[n];

		if (set->v[i].id != FIG_uid_clients)
			continue;
		tensord__uid_usage__init(w);
		w->uid = (uint32_t)strtoul(uid, NULL, 10);
		w->clients = (uint32_t)set->v[i].value;
		w->tensors = (uint64_t)sum(set, FIG_uid_tensors, uid);
		w->bytes = (uint64_t)sum(set, FIG_uid_bytes, uid);
		w->waiters = (uint32_t)sum(set, FIG_uid_waiters, uid);
		w->fds_in_flight = (uint32_t)sum(set, FIG_uid_fds_in_flight, uid);
		w->fds = (uint64_t)sum(set, FIG_uid_fds, uid);
		l->prows[n++] = w;
	}
	sr->n_uids = n;
	sr->uids = l->prows;
}

static void legacy_fill(Tensord__StatsReply *sr, const struct figure_set *set, struct legacy *l)
{
	sr->tensors = (uint64_t)sum(set, FIG_tensors, NULL);
	sr->clients = (uint64_t)sum(set, FIG_clients, NULL);
	sr->leases = (uint64_t)sum(set, FIG_leases, NULL);
	sr->uptime_ns = (uint64_t)(sum(set, FIG_uptime_seconds, NULL) * 1e9);
	sr->daemon_pid = (uint32_t)sum(set, FIG_daemon_pid, NULL);
	sr->daemon_fds = (uint32_t)sum(set, FIG_open_fds, NULL);
	sr->host_pool_fds = (uint32_t)sum(set, FIG_host_pool_fds, NULL);
	sr->host_pool_bytes = (uint64_t)sum(set, FIG_host_pool_bytes, NULL);
	sr->host_pool_budget = (uint64_t)sum(set, FIG_host_pool_budget_bytes, NULL);
	sr->host_pool_hits = (uint64_t)sum(set, FIG_host_pool_hits_total, NULL);
	sr->host_pool_misses = (uint64_t)sum(set, FIG_host_pool_misses_total, NULL);
	sr->host_slabs = (uint32_t)sum(set, FIG_host_slabs, NULL);
	sr->host_slab_bytes = (uint64_t)sum(set, FIG_host_slab_bytes, NULL);
	sr->cleanup_steps = (uint64_t)sum(set, FIG_cleanup_steps_total, NULL);
	sr->fd_waits = (uint64_t)sum(set, FIG_fd_waits_total, NULL);
	legacy_devices(sr, set, l);
	legacy_uids(sr, set, l);
}

/* Storage the Figure messages point into while the reply is packed. */
struct wire {
	Tensord__Figure figs[FIG_COUNT], *pfigs[FIG_COUNT];
	Tensord__Sample *samples, **psamples;
	char **values;
};

static int wire_fill(Tensord__StatsReply *sr, const struct figure_set *set, struct wire *w)
{
	size_t n = set->n ? set->n : 1, k = 0, nf = 0;

	w->samples = malloc(n * sizeof(*w->samples));
	w->psamples = malloc(n * sizeof(*w->psamples));
	w->values = malloc(n * FIGURE_LABELS_MAX * sizeof(*w->values));
	if (!w->samples || !w->psamples || !w->values)
		return -1;
	for (size_t i = 0; i < set->n; i++) {
		const struct figure_sample *p = &set->v[i];
		const struct figure *f = &figures[p->id];
		Tensord__Sample *s = &w->samples[i];

		tensord__sample__init(s);
		s->n_values = f->n_labels;
		s->values = &w->values[i * FIGURE_LABELS_MAX];
		for (unsigned j = 0; j < f->n_labels; j++)
			s->values[j] = (char *)p->values[j];
		s->value = p->value;
		if (p->counts) {
			s->n_bounds = p->n_bounds;
			s->bounds = (double *)p->bounds;
			s->n_counts = p->n_bounds + 1;
			s->counts = (uint64_t *)p->counts;
		}
		w->psamples[i] = s;
	}
	/* The samples are in table order: each figure takes a run of them. */
	for (unsigned i = 0; i < FIG_COUNT; i++) {
		const struct figure *f = &figures[i];
		Tensord__Figure *m = &w->figs[nf];

		if (set->absent[i])
			continue;
		tensord__figure__init(m);
		m->name = (char *)f->name;
		m->type = (Tensord__Figure__Type)f->type;
		m->scope = (Tensord__Figure__Scope)f->scope;
		m->unit = (Tensord__Figure__Unit)f->unit;
		m->help = (char *)f->help;
		m->n_labels = f->n_labels;
		m->labels = (char **)f->labels;
		m->samples = &w->psamples[k];
		for (; k < set->n && set->v[k].id == f->id; k++)
			m->n_samples++;
		w->pfigs[nf++] = m;
	}
	sr->n_figures = nf;
	sr->figures = w->pfigs;
	return 0;
}

void reply_stats(struct conn *c, uint64_t req_id, const struct figure_set *set, bool figures_only)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__StatsReply sr = TENSORD__STATS_REPLY__INIT;
	struct legacy l = { 0 };
	struct wire *w = calloc(1, sizeof(*w));

	if (!w || wire_fill(&sr, set, w) < 0) {
		reply_status(c, TENSORD__REQUEST__BODY_STATS, req_id, -ENOMEM,
			     "out of memory answering stats");
		goto out;
	}
	if (!figures_only)
		legacy_fill(&sr, set, &l);
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_STATS;
	rep.stats = &sr;
	reply_send(c, &rep, NULL);
out:
	free(l.rows);
	free(l.prows);
	if (w) {
		free(w->samples);
		free(w->psamples);
		free(w->values);
	}
	free(w);
}
