/*
 * libtensord: the daemon's figures. One Stats round trip brings every
 * figure with its name, type, unit, scope, help and labelled samples
 * (daemon/figures.def), so the library knows none of them by heart: it
 * hands them out as they came (tensord_figures()), as one JSON object
 * (tensord_stats_json(), the shape of Python's stats() and of `tensorctl
 * stats --json`), and, for callers of the older calls, fills the structs
 * those return by figure name.
 */
#include <errno.h>
#include <math.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

static int stats_once(tensord_client *c, void *arg)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Stats st = TENSORD__STATS__INIT;

	st.figures_only = true;
	req.body_case = TENSORD__REQUEST__BODY_STATS;
	req.stats = &st;
	return td_rpc(c, &req, arg, NULL);
}

/*
 * A Stats round trip for the figures (sent once more when the daemon went
 * away meanwhile). On success *ret_rep is the caller's to free.
 */
static int stats_rpc(tensord_client *c, Tensord__Reply **ret_rep)
{
	Tensord__Reply *rep;
	int r;

	r = td_read(c, stats_once, &rep);
	if (r < 0)
		return r;
	if (rep->body_case != TENSORD__REPLY__BODY_STATS) {
		tensord__reply__free_unpacked(rep, NULL);
		return td_set_error(-EPROTO, "tensord answered stats without stats");
	}
	if (!rep->stats->n_figures) {
		tensord__reply__free_unpacked(rep, NULL);
		return td_set_error(-EPROTONOSUPPORT,
				    "tensord sends no figures: it is older than this library");
	}
	*ret_rep = rep;
	return 0;
}

/* --- the figures as one block ---------------------------------------------------- */

/* Space taken from one block: measured first (base NULL), then filled. */
struct block {
	char *base;
	size_t off;
};

static void *take(struct block *b, size_t size, size_t align)
{
	void *p;

	b->off = (b->off + align - 1) / align * align;
	p = b->base ? b->base + b->off : NULL;
	b->off += size;
	return p;
}

static const char *str(struct block *b, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = take(b, n, 1);

	if (p)
		memcpy(p, s, n);
	return p;
}

/* Strings last, so the arrays before them stay aligned: two passes over the reply. */
static void lay_out(const Tensord__StatsReply *sr, struct block *b, tensord_figure *v)
{
	const char **labels[sr->n_figures ? sr->n_figures : 1];
	const char **values[sr->n_figures ? sr->n_figures : 1];

	for (size_t i = 0; i < sr->n_figures; i++) {
		const Tensord__Figure *m = sr->figures[i];
		tensord_sample *s = take(b, m->n_samples * sizeof(*s), alignof(tensord_sample));

		labels[i] = take(b, m->n_labels * sizeof(char *), alignof(char *));
		values[i] = take(b, m->n_samples * m->n_labels * sizeof(char *), alignof(char *));
		for (size_t j = 0; j < m->n_samples; j++) {
			const Tensord__Sample *w = m->samples[j];
			double *bounds = take(b, w->n_bounds * sizeof(double), alignof(double));
			uint64_t *counts =
				take(b, w->n_counts * sizeof(uint64_t), alignof(uint64_t));

			if (!v)
				continue;
			if (w->n_bounds)
				memcpy(bounds, w->bounds, w->n_bounds * sizeof(double));
			if (w->n_counts)
				memcpy(counts, w->counts, w->n_counts * sizeof(uint64_t));
			s[j] = (tensord_sample){ .values = values[i] + j * m->n_labels,
						 .value = w->value,
						 .n_bounds = w->n_counts ? w->n_bounds : 0,
						 .bounds = w->n_counts ? bounds : NULL,
						 .counts = w->n_counts ? counts : NULL };
		}
		if (v)
			v[i] = (tensord_figure){ .type = (tensord_figure_type)m->type,
						 .scope = (tensord_figure_scope)m->scope,
						 .unit = (tensord_figure_unit)m->unit,
						 .n_labels = m->n_labels,
						 .labels = labels[i],
						 .n_samples = m->n_samples,
						 .samples = s };
	}
	for (size_t i = 0; i < sr->n_figures; i++) {
		const Tensord__Figure *m = sr->figures[i];
		const char *name = str(b, m->name), *help = str(b, m->help);

		if (v) {
			v[i].name = name;
			v[i].help = help;
		}
		for (size_t k = 0; k < m->n_labels; k++) {
			const char *l = str(b, m->labels[k]);

			if (v)
				labels[i][k] = l;
		}
		for (size_t j = 0; j < m->n_samples; j++)
			for (size_t k = 0; k < m->n_labels; k++) {
				const char *val = str(b, m->samples[j]->values[k]);

				if (v)
					values[i][j * m->n_labels + k] = val;
			}
	}
}

/* What a daemon's figures must be before they are handed out. 0 or -EPROTO. */
static int check_figures(const Tensord__StatsReply *sr)
{
	for (size_t i = 0; i < sr->n_figures; i++) {
		const Tensord__Figure *m = sr->figures[i];

		if ((unsigned)m->type > TENSORD_FIGURE_HISTOGRAM ||
		    (unsigned)m->scope > TENSORD_SCOPE_UID ||
		    (unsigned)m->unit > TENSORD_UNIT_SECONDS)
			return td_set_error(-EPROTO, "figure '%s': unknown type, scope or unit",
					    m->name);
		if ((m->scope == TENSORD__FIGURE__SCOPE__DEVICE && m->n_labels < 3) ||
		    (m->scope == TENSORD__FIGURE__SCOPE__UID && m->n_labels < 1))
			return td_set_error(-EPROTO, "figure '%s': fewer labels than its scope has",
					    m->name);
		for (size_t j = 0; j < m->n_samples; j++) {
			const Tensord__Sample *w = m->samples[j];

			if (w->n_values != m->n_labels)
				return td_set_error(-EPROTO,
						    "figure '%s': a sample with %zu label values "
						    "for %zu labels",
						    m->name, w->n_values, m->n_labels);
			if (w->n_counts && w->n_counts != w->n_bounds + 1)
				return td_set_error(-EPROTO,
						    "figure '%s': %zu bucket counts for %zu bounds",
						    m->name, w->n_counts, w->n_bounds);
		}
	}
	return 0;
}

int tensord_figures(tensord_client *c, tensord_figure **ret_figures, size_t *ret_count)
{
	Tensord__Reply *rep = NULL;
	struct block b = { 0 };
	tensord_figure *v;
	size_t head;
	int r;

	if (!ret_figures || !ret_count)
		return td_set_error(-EINVAL, "figures: NULL output");
	r = stats_rpc(c, &rep);
	if (r < 0)
		return r;
	r = check_figures(rep->stats);
	if (r < 0)
		goto out;
	head = rep->stats->n_figures * sizeof(*v);
	b.off = head;
	lay_out(rep->stats, &b, NULL);
	v = malloc(b.off);
	if (!v) {
		r = td_set_error(-ENOMEM, "out of memory for %zu bytes of figures", b.off);
		goto out;
	}
	b = (struct block){ .base = (char *)v, .off = head };
	lay_out(rep->stats, &b, v);
	*ret_figures = v;
	*ret_count = rep->stats->n_figures;
out:
	tensord__reply__free_unpacked(rep, NULL);
	return r;
}

/* --- lookups by name ------------------------------------------------------------- */

static const tensord_figure *find(const tensord_figure *v, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(v[i].name, name) == 0)
			return &v[i];
	return NULL;
}

/* The samples of figure name whose first label is row (NULL: any), added up; 0 when none. */
static double sum(const tensord_figure *v, size_t n, const char *name, const char *row)
{
	const tensord_figure *f = find(v, n, name);
	double s = 0;

	for (size_t j = 0; f && j < f->n_samples; j++)
		if (!row || (f->n_labels && strcmp(f->samples[j].values[0], row) == 0))
			s += f->samples[j].value;
	return s;
}

int tensord_stats(tensord_client *c, tensord_daemon_stats *ret_stats, size_t size)
{
	tensord_daemon_stats all = { 0 }, *ret = &all;
	const tensord_figure *used;
	tensord_figure *v;
	size_t n;
	int r;

	if (!ret_stats || size < TENSORD_STATS_SIZE_V1)
		return td_set_error(-EINVAL,
				    "stats: a buffer of %zu bytes is smaller than "
				    "tensord_daemon_stats ever was (%zu)",
				    size, (size_t)TENSORD_STATS_SIZE_V1);
	r = tensord_figures(c, &v, &n);
	if (r < 0)
		return r;
	ret->size = (uint32_t)(size < sizeof(*ret) ? size : sizeof(*ret));
	ret->tensors = (uint64_t)sum(v, n, "tensors", NULL);
	ret->clients = (uint64_t)sum(v, n, "clients", NULL);
	ret->leases = (uint64_t)sum(v, n, "leases", NULL);
	ret->uptime_ns = (uint64_t)(sum(v, n, "uptime_seconds", NULL) * 1e9);
	ret->daemon_pid = (uint32_t)sum(v, n, "daemon_pid", NULL);
	used = find(v, n, "device_used_bytes");
	for (size_t i = 0; used && i < used->n_samples && i < TENSORD_STATS_DEVICES_MAX; i++) {
		const char *const *lv = used->samples[i].values;
		tensord_device_stats *d = &ret->devices[ret->n_devices];

		if (used->n_labels < 3 || tensord_device_parse(lv[0], &d->device) < 0)
			continue;
		snprintf(d->backend, sizeof(d->backend), "%s", lv[1]);
		snprintf(d->path, sizeof(d->path), "%s", lv[2]);
		d->bytes_used = (uint64_t)used->samples[i].value;
		d->bytes_capacity = (uint64_t)sum(v, n, "device_capacity_bytes", lv[0]);
		d->tensors = (uint32_t)sum(v, n, "device_tensors", lv[0]);
		ret->device_gpu_bytes[ret->n_devices] =
			(uint64_t)sum(v, n, "device_gpu_bytes", lv[0]);
		ret->n_devices++;
	}
	ret->daemon_fds = (uint32_t)sum(v, n, "open_fds", NULL);
	ret->host_pool_fds = (uint32_t)sum(v, n, "host_pool_fds", NULL);
	ret->host_pool_bytes = (uint64_t)sum(v, n, "host_pool_bytes", NULL);
	ret->host_pool_budget = (uint64_t)sum(v, n, "host_pool_budget_bytes", NULL);
	ret->host_pool_hits = (uint64_t)sum(v, n, "host_pool_hits_total", NULL);
	ret->host_pool_misses = (uint64_t)sum(v, n, "host_pool_misses_total", NULL);
	ret->host_slabs = (uint32_t)sum(v, n, "host_slabs", NULL);
	ret->host_slab_bytes = (uint64_t)sum(v, n, "host_slab_bytes", NULL);
	free(v);
	memcpy(ret_stats, ret, ret->size);
	return 0;
}

static int cmp_uid(const void *a, const void *b)
{
	uint32_t x = ((const tensord_uid_stats *)a)->uid, y = ((const tensord_uid_stats *)b)->uid;

	return x < y ? -1 : x > y;
}

int tensord_uid_usage(tensord_client *c, tensord_uid_stats **ret_usage, size_t *ret_count)
{
	const tensord_figure *rows;
	tensord_uid_stats *u;
	tensord_figure *v;
	size_t n, k = 0;
	int r = tensord_figures(c, &v, &n);

	if (r < 0)
		return r;
	/* Every uid the daemon counts has a row of each of its per-uid figures. */
	rows = find(v, n, "uid_clients");
	u = calloc(rows && rows->n_samples ? rows->n_samples : 1, sizeof(*u));
	if (!u) {
		free(v);
		return td_set_error(-ENOMEM, "out of memory for the per-uid rows");
	}
	for (size_t i = 0; rows && rows->n_labels && i < rows->n_samples; i++) {
		const char *uid = rows->samples[i].values[0];

		u[k++] = (tensord_uid_stats){
			.uid = (uint32_t)strtoul(uid, NULL, 10),
			.clients = (uint32_t)rows->samples[i].value,
			.tensors = (uint64_t)sum(v, n, "uid_tensors", uid),
			.fds = (uint64_t)sum(v, n, "uid_fds", uid),
			.bytes = (uint64_t)sum(v, n, "uid_bytes", uid),
			.waiters = (uint32_t)sum(v, n, "uid_waiters", uid),
			.fds_in_flight = (uint32_t)sum(v, n, "uid_fds_in_flight", uid),
		};
	}
	if (k > 1)
		qsort(u, k, sizeof(*u), cmp_uid);
	free(v);
	*ret_usage = u;
	*ret_count = k;
	return 0;
}

/* --- JSON ------------------------------------------------------------------------ */

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20 || *p >= 0x7f)
			fprintf(f, "\\u%04x",
				*p); /* labels are ASCII; anything else stays visible */
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

static void json_number(FILE *f, const tensord_figure *fig, double v)
{
	if (!isfinite(v))
		fputs("null", f);
	else if (fig->unit == TENSORD_UNIT_SECONDS)
		fprintf(f, "%.9f", v);
	else
		fprintf(f, "%.0f", v);
}

static void json_histogram(FILE *f, const tensord_figure *fig, const tensord_sample *s)
{
	uint64_t cum = 0;

	for (size_t b = 0; b <= s->n_bounds && s->counts; b++)
		cum += s->counts[b];
	fprintf(f, "{\"count\": %llu, \"sum\": ", (unsigned long long)cum);
	json_number(f, fig, s->value);
	fputs(", \"buckets\": {", f);
	cum = 0;
	for (size_t b = 0; b <= s->n_bounds && s->counts; b++) {
		cum += s->counts[b];
		if (b < s->n_bounds)
			fprintf(f, "%s\"%g\": ", b ? ", " : "", s->bounds[b]);
		else
			fprintf(f, "%s\"+Inf\": ", b ? ", " : "");
		fprintf(f, "%llu", (unsigned long long)cum);
	}
	fputs("}}", f);
}

/* Whether sample s agrees with key on labels [0, depth). */
static bool matches(const tensord_sample *s, const char *const *key, size_t depth)
{
	for (size_t l = 0; l < depth; l++)
		if (strcmp(s->values[l], key[l]) != 0)
			return false;
	return true;
}

/*
 * The samples of fig agreeing with key on labels [0, depth): the value of
 * the first, once every label is fixed; else an object keyed by the next
 * label's values, in the order they first come.
 */
static void json_nested(FILE *f, const tensord_figure *fig, const char **key, size_t depth)
{
	bool first = true;

	if (depth == fig->n_labels) {
		for (size_t j = 0; j < fig->n_samples; j++) {
			const tensord_sample *s = &fig->samples[j];

			if (!matches(s, key, depth))
				continue;
			if (fig->type == TENSORD_FIGURE_HISTOGRAM)
				json_histogram(f, fig, s);
			else
				json_number(f, fig, s->value);
			return;
		}
		fputs("null", f);
		return;
	}
	fputc('{', f);
	for (size_t j = 0; j < fig->n_samples; j++) {
		const tensord_sample *s = &fig->samples[j];
		bool seen = false;

		if (!matches(s, key, depth))
			continue;
		for (size_t e = 0; e < j && !seen; e++)
			seen = matches(&fig->samples[e], key, depth) &&
			       strcmp(fig->samples[e].values[depth], s->values[depth]) == 0;
		if (seen)
			continue;
		fputs(first ? "" : ", ", f);
		first = false;
		json_str(f, s->values[depth]);
		fputs(": ", f);
		key[depth] = s->values[depth];
		json_nested(f, fig, key, depth + 1);
	}
	fputc('}', f);
}

/* Whether a sample of a figure of scope, before index j of fig or in an
 * earlier figure, already opened the row of s (its first width labels). */
static bool row_seen(const tensord_figure *v, size_t i, size_t j, const tensord_sample *s,
		     size_t width)
{
	for (size_t a = 0; a <= i; a++) {
		if (v[a].scope != v[i].scope)
			continue;
		for (size_t b = 0; b < (a == i ? j : v[a].n_samples); b++)
			if (matches(&v[a].samples[b], s->values, width))
				return true;
	}
	return false;
}

static int cmp_uid_str(const void *a, const void *b)
{
	unsigned long x = strtoul(*(const char *const *)a, NULL, 10);
	unsigned long y = strtoul(*(const char *const *)b, NULL, 10);

	return x < y ? -1 : x > y;
}

/* One object per row of scope: its key labels, then each figure's samples of the row. */
static int json_rows(FILE *f, const tensord_figure *v, size_t n, tensord_figure_scope scope)
{
	size_t width = scope == TENSORD_SCOPE_DEVICE ? 3 : 1, n_rows = 0, cap = 0;
	const char *const **rows = NULL;

	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; v[i].scope == scope && j < v[i].n_samples; j++) {
			if (row_seen(v, i, j, &v[i].samples[j], width))
				continue;
			if (n_rows == cap) {
				const char *const **nr;

				cap = cap ? 2 * cap : 16;
				nr = realloc(rows, cap * sizeof(*rows));
				if (!nr) {
					free(rows);
					return -ENOMEM;
				}
				rows = nr;
			}
			rows[n_rows++] = v[i].samples[j].values;
		}
	if (scope == TENSORD_SCOPE_UID && n_rows > 1) /* rows is NULL when there are none */
		qsort(rows, n_rows, sizeof(*rows), cmp_uid_str);
	for (size_t r = 0; r < n_rows; r++) {
		const char *key[8];

		fputs(r ? ", {" : "{", f);
		if (scope == TENSORD_SCOPE_DEVICE) {
			fputs("\"device\": ", f);
			json_str(f, rows[r][0]);
			fputs(", \"backend\": ", f);
			json_str(f, rows[r][1]);
			fputs(", \"path\": ", f);
			json_str(f, rows[r][2]);
		} else {
			fprintf(f, "\"uid\": %lu", strtoul(rows[r][0], NULL, 10));
		}
		for (size_t i = 0; i < n; i++) {
			bool has = false;

			if (v[i].scope != scope || v[i].n_labels > 8)
				continue;
			for (size_t j = 0; j < v[i].n_samples && !has; j++)
				has = matches(&v[i].samples[j], rows[r], width);
			if (!has)
				continue;
			fputs(", ", f);
			json_str(f, v[i].name);
			fputs(": ", f);
			memcpy(key, rows[r], width * sizeof(*key));
			json_nested(f, &v[i], key, width);
		}
		fputc('}', f);
	}
	free(rows);
	return 0;
}

/* The JSON of figures v. 0 or -ENOMEM. */
static int json_of(const tensord_figure *v, size_t n, char **ret)
{
	size_t len;
	char *text = NULL;
	FILE *f = open_memstream(&text, &len);
	bool first = true;
	int r;

	if (!f)
		return -ENOMEM;
	fputc('{', f);
	for (size_t i = 0; i < n; i++) {
		const char *key[8];

		if (v[i].scope != TENSORD_SCOPE_DAEMON || v[i].n_labels > 8)
			continue;
		fputs(first ? "" : ", ", f);
		first = false;
		json_str(f, v[i].name);
		fputs(": ", f);
		json_nested(f, &v[i], key, 0);
	}
	fputs(first ? "\"devices\": [" : ", \"devices\": [", f);
	r = json_rows(f, v, n, TENSORD_SCOPE_DEVICE);
	fputs("], \"uids\": [", f);
	if (r == 0)
		r = json_rows(f, v, n, TENSORD_SCOPE_UID);
	fputs("]}", f);
	if (ferror(f))
		r = -ENOMEM;
	if (fclose(f) != 0 || r < 0) {
		free(text);
		return -ENOMEM;
	}
	*ret = text;
	return 0;
}

int tensord_stats_json(tensord_client *c, char **ret_json)
{
	tensord_figure *v;
	size_t n;
	int r;

	if (!ret_json)
		return td_set_error(-EINVAL, "stats_json: NULL output");
	r = tensord_figures(c, &v, &n);
	if (r < 0)
		return r;
	r = json_of(v, n, ret_json);
	free(v);
	if (r < 0)
		return td_set_error(r, "out of memory writing the figures as JSON");
	return 0;
}
