/*
 * tensorctl stats: the daemon's figures as text, written from what they
 * say of themselves (name, unit, scope, labels), so a figure the daemon
 * adds shows here without a new tensorctl. The daemon's figures first, a
 * line each; then a table of the devices and one of the uids, a column per
 * figure. --json prints libtensord's tensord_stats_json() instead.
 *
 * Every string from the daemon (names, label values) is printed through
 * quote(): the daemon is trusted to serve memory, not to write to a
 * terminal.
 */
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorctl.h"

/* v as its unit says: "1.5 MiB", "12.0 us", "0d 01h 02m 03s", "42". */
static const char *amount(const tensord_figure *f, double v, char *buf, size_t len)
{
	if (f->unit == TENSORD_UNIT_BYTES)
		return human(v > 0 ? (uint64_t)v : 0, buf, len);
	if (f->unit == TENSORD_UNIT_SECONDS) {
		uint64_t s = v > 0 ? (uint64_t)v : 0;

		if (v < 1e-3)
			snprintf(buf, len, "%.1f us", v * 1e6);
		else if (v < 1)
			snprintf(buf, len, "%.1f ms", v * 1e3);
		else if (v < 60)
			snprintf(buf, len, "%.3f s", v);
		else
			snprintf(buf, len,
				 "%" PRIu64 "d %02" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s",
				 s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
		return buf;
	}
	snprintf(buf, len, "%.0f", v);
	return buf;
}

/* A histogram's sample: how many it observed, and their mean. */
static const char *observed(const tensord_figure *f, const tensord_sample *s, char *buf, size_t len)
{
	uint64_t n = 0;
	char mean[32];

	for (size_t b = 0; s->counts && b <= s->n_bounds; b++)
		n += s->counts[b];
	if (!n)
		snprintf(buf, len, "none observed");
	else
		snprintf(buf, len, "%" PRIu64 " observed, mean %s", n,
			 amount(f, s->value / (double)n, mean, sizeof(mean)));
	return buf;
}

/* A figure of the daemon: its value, or "label=value ..." of its samples that are not 0. */
static void daemon_line(const tensord_figure *f)
{
	char q[QUOTE_MAX], v[64];
	bool any = false;

	printf("%-26s", quote(f->name, QUOTE_TABLE, q, sizeof(q)));
	for (size_t j = 0; j < f->n_samples; j++) {
		const tensord_sample *s = &f->samples[j];

		if (f->type == TENSORD_FIGURE_HISTOGRAM)
			observed(f, s, v, sizeof(v));
		else if (f->n_labels && s->value == 0)
			continue;
		else
			amount(f, s->value, v, sizeof(v));
		printf(" ");
		for (size_t l = 0; l < f->n_labels; l++)
			printf("%s%s", l ? "/" : "",
			       quote(s->values[l], QUOTE_TABLE, q, sizeof(q)));
		printf("%s%s", f->n_labels ? "=" : "", v);
		any = true;
	}
	printf("%s\n", any ? "" : f->n_labels ? " none" : " -");
}

/* The rows of a table: the first width label values of every sample of scope, once each. */
struct rows {
	const char *const **key;
	size_t n;
};

static bool same_row(const char *const *a, const char *const *b, size_t width)
{
	for (size_t l = 0; l < width; l++)
		if (strcmp(a[l], b[l]) != 0)
			return false;
	return true;
}

static int rows_of(const tensord_figure *v, size_t n, tensord_figure_scope scope, size_t width,
		   struct rows *r)
{
	size_t cap = 0;

	r->key = NULL;
	r->n = 0;
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; v[i].scope == scope && j < v[i].n_samples; j++) {
			const char *const *k = v[i].samples[j].values;
			bool seen = false;

			for (size_t e = 0; e < r->n && !seen; e++)
				seen = same_row(r->key[e], k, width);
			if (seen)
				continue;
			if (r->n == cap) {
				const char *const **nk;

				cap = cap ? 2 * cap : 16;
				nk = realloc(r->key, cap * sizeof(*nk));
				if (!nk) {
					free(r->key);
					return -1;
				}
				r->key = nk;
			}
			r->key[r->n++] = k;
		}
	return 0;
}

/* What a table's cells are read from (print_table()'s rows). */
struct table {
	struct rows r;
	size_t width;                              /* key columns */
	const tensord_figure *col[TABLE_COLS_MAX]; /* the figure of each column past them */
};

/* The cell of figure f on row key: its samples there added up (a histogram: observations). */
static const char *table_cell(const void *rows, size_t i, int col, char *buf, size_t len)
{
	const struct table *t = rows;
	const tensord_figure *f = t->col[col];
	const char *const *key = t->r.key[i];
	double sum = 0;
	bool any = false;

	if ((size_t)col < t->width)
		return key[col];
	for (size_t j = 0; j < f->n_samples; j++) {
		const tensord_sample *s = &f->samples[j];

		if (!same_row(s->values, key, t->width))
			continue;
		any = true;
		if (f->type == TENSORD_FIGURE_HISTOGRAM)
			for (size_t b = 0; s->counts && b <= s->n_bounds; b++)
				sum += (double)s->counts[b];
		else
			sum += s->value;
	}
	if (!any)
		return "-";
	if (f->type == TENSORD_FIGURE_HISTOGRAM) {
		snprintf(buf, len, "%.0f", sum);
		return buf;
	}
	return amount(f, sum, buf, len);
}

/*
 * One table: the key columns (keys[], width of them), then a column per
 * figure of scope, headed by its name without prefix, in capitals; as many
 * as a table holds. 0, or -1 out of memory.
 */
static int table(const tensord_figure *v, size_t n, tensord_figure_scope scope,
		 const char *const *keys, size_t width, const char *prefix)
{
	char titles_buf[TABLE_COLS_MAX][64];
	const char *titles[TABLE_COLS_MAX];
	struct table t = { .width = width };
	size_t cols = width;
	unsigned right = 0;

	for (size_t k = 0; k < width; k++)
		titles[k] = keys[k];
	for (size_t i = 0; i < n && cols < TABLE_COLS_MAX; i++) {
		const char *name = v[i].name;

		if (v[i].scope != scope)
			continue;
		if (strncmp(name, prefix, strlen(prefix)) == 0 && name[strlen(prefix)])
			name += strlen(prefix);
		snprintf(titles_buf[cols], sizeof(titles_buf[cols]), "%s", name);
		for (char *p = titles_buf[cols]; *p; p++)
			*p = (char)toupper((unsigned char)*p);
		titles[cols] = titles_buf[cols];
		t.col[cols] = &v[i];
		right |= 1u << cols;
		cols++;
	}
	if (rows_of(v, n, scope, width, &t.r) < 0)
		return -1;
	printf("\n");
	print_table(titles, (int)cols, right, &t, t.r.n, table_cell);
	free(t.r.key);
	return 0;
}

int print_figures_text(const tensord_figure *v, size_t n)
{
	static const char *const device_keys[] = { "DEVICE", "BACKEND", "PATH" };
	static const char *const uid_keys[] = { "UID" };

	for (size_t i = 0; i < n; i++)
		if (v[i].scope == TENSORD_SCOPE_DAEMON)
			daemon_line(&v[i]);
	if (table(v, n, TENSORD_SCOPE_DEVICE, device_keys, 3, "device_") < 0 ||
	    table(v, n, TENSORD_SCOPE_UID, uid_keys, 1, "uid_") < 0) {
		fprintf(stderr, "tensorctl: stats: out of memory\n");
		return -1;
	}
	return 0;
}

/* --- the summary (stats without --raw) -------------------------------------------- */

static const tensord_figure *figure(const tensord_figure *v, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(v[i].name, name) == 0)
			return &v[i];
	return NULL;
}

/* The sum of name's samples whose first width label values are key (width 0: all). */
static double value_of(const tensord_figure *v, size_t n, const char *name, const char *const *key,
		       size_t width)
{
	const tensord_figure *f = figure(v, n, name);
	double sum = 0;

	for (size_t j = 0; f && j < f->n_samples; j++)
		if (!width || same_row(f->samples[j].values, key, width))
			sum += f->samples[j].value;
	return sum;
}

static uint64_t scalar(const tensord_figure *v, size_t n, const char *name)
{
	double d = value_of(v, n, name, NULL, 0);

	return d > 0 ? (uint64_t)d : 0;
}

/* The rows of the summary's tables, and the figures they read. */
struct summary {
	const tensord_figure *v;
	size_t n;
	struct rows r;
};

enum { SD_DEVICE, SD_BACKEND, SD_PATH, SD_TENSORS, SD_USED, SD_CAPACITY, SD_USE, SD_GPU, SD_N };

static const char *device_cell(const void *rows, size_t i, int col, char *buf, size_t len)
{
	const struct summary *s = rows;
	const char *const *key = s->r.key[i];
	double used, cap;

	switch (col) {
	case SD_DEVICE:
	case SD_BACKEND:
	case SD_PATH:
		return key[col];
	case SD_TENSORS:
		snprintf(buf, len, "%.0f", value_of(s->v, s->n, "device_tensors", key, 3));
		return buf;
	case SD_USED:
		return human((uint64_t)value_of(s->v, s->n, "device_used_bytes", key, 3), buf, len);
	case SD_CAPACITY:
		cap = value_of(s->v, s->n, "device_capacity_bytes", key, 3);
		return cap > 0 ? human((uint64_t)cap, buf, len) : "-";
	case SD_USE:
		used = value_of(s->v, s->n, "device_used_bytes", key, 3);
		cap = value_of(s->v, s->n, "device_capacity_bytes", key, 3);
		if (cap <= 0)
			return "-";
		snprintf(buf, len, "%.1f%%", 100.0 * used / cap);
		return buf;
	default:
		used = value_of(s->v, s->n, "device_gpu_bytes", key, 3);
		return used > 0 ? human((uint64_t)used, buf, len) : "-";
	}
}

enum {
	SU_UID,
	SU_USER,
	SU_CLIENTS,
	SU_TENSORS,
	SU_FDS,
	SU_BYTES,
	SU_PINNED,
	SU_WAITERS,
	SU_IN_FLIGHT,
	SU_N
};

static const char *uid_cell(const void *rows, size_t i, int col, char *buf, size_t len)
{
	static const char *const names[SU_N] = {
		[SU_CLIENTS] = "uid_clients",
		[SU_TENSORS] = "uid_tensors",
		[SU_FDS] = "uid_fds",
		[SU_BYTES] = "uid_bytes",
		[SU_PINNED] = "uid_pinned_bytes",
		[SU_WAITERS] = "uid_waiters",
		[SU_IN_FLIGHT] = "uid_fds_in_flight",
	};
	const struct summary *s = rows;
	const char *const *key = s->r.key[i];
	double d;

	if (col == SU_UID)
		return key[0];
	if (col == SU_USER) {
		char *end;
		unsigned long uid = strtoul(key[0], &end, 10);

		return *end || end == key[0] ? "-" : owner_name((uint32_t)uid, buf, len);
	}
	d = value_of(s->v, s->n, names[col], key, 1);
	if (col == SU_BYTES || col == SU_PINNED)
		return human(d > 0 ? (uint64_t)d : 0, buf, len);
	snprintf(buf, len, "%.0f", d);
	return buf;
}

int print_stats_summary(const tensord_figure *v, size_t n)
{
	static const char *const device_titles[SD_N] = {
		"DEVICE", "BACKEND", "PATH", "TENSORS", "USED", "CAPACITY", "USE", "GPU MEMORY"
	};
	static const char *const uid_titles[SU_N] = { "UID",     "USER",     "CLIENTS",
						      "TENSORS", "WITH FDS", "BYTES",
						      "PINNED",  "WAITERS",  "IN FLIGHT" };
	struct summary s = { .v = v, .n = n };
	uint64_t up = scalar(v, n, "uptime_seconds"), unlinked, peers;
	char a[32], b[32], c[32];

	const tensord_figure *states = figure(v, n, "device_tensors");

	/* Unlinked tensors some lease still holds: their memory is not free yet. */
	unlinked = 0;
	for (size_t j = 0; states && states->n_labels && j < states->n_samples; j++)
		if (strcmp(states->samples[j].values[states->n_labels - 1], "unlinked") == 0)
			unlinked += (uint64_t)states->samples[j].value;
	printf("tensors:  %" PRIu64, scalar(v, n, "tensors"));
	if (unlinked)
		printf(" (%" PRIu64 " unlinked, still leased: tensorctl leases)", unlinked);
	printf("\nclients:  %" PRIu64 "\n", scalar(v, n, "clients"));
	printf("leases:   %" PRIu64 "\n", scalar(v, n, "leases"));
	printf("uptime:   %" PRIu64 "d %02" PRIu64 "h %02" PRIu64 "m %02" PRIu64 "s\n", up / 86400,
	       up / 3600 % 24, up / 60 % 60, up % 60);
	printf("pid:      %" PRIu64 "\n", scalar(v, n, "daemon_pid"));
	printf("fds:      %" PRIu64 "\n", scalar(v, n, "open_fds"));
	printf("pool:     %s ready in %" PRIu64 " memfds of %s; %" PRIu64 " hits, %" PRIu64
	       " misses\n",
	       human(scalar(v, n, "host_pool_bytes"), a, sizeof(a)), scalar(v, n, "host_pool_fds"),
	       human(scalar(v, n, "host_pool_budget_bytes"), b, sizeof(b)),
	       scalar(v, n, "host_pool_hits_total"), scalar(v, n, "host_pool_misses_total"));
	printf("slabs:    %" PRIu64 " holding %s\n", scalar(v, n, "host_slabs"),
	       human(scalar(v, n, "host_slab_bytes"), c, sizeof(c)));
	/* docs/restart.md: whether published tensors would survive a restart now. */
	if (scalar(v, n, "restart_store"))
		printf("restart:  tensors kept in the descriptor store (%" PRIu64
		       " descriptors); %" PRIu64 " would not survive; %" PRIu64
		       " restored at start (%s)\n",
		       scalar(v, n, "restart_stored_fds"),
		       scalar(v, n, "restart_unprotected_tensors"),
		       scalar(v, n, "restart_restored_tensors"),
		       human(scalar(v, n, "restart_restored_bytes"), a, sizeof(a)));
	else
		printf("restart:  no descriptor store: a restart loses every tensor\n");
	peers = scalar(v, n, "peers");
	if (peers)
		printf("peers:    %" PRIu64 ", %" PRIu64 " up (tensorctl peers)\n", peers,
		       scalar(v, n, "peers_up"));
	if (rows_of(v, n, TENSORD_SCOPE_DEVICE, 3, &s.r) < 0)
		goto oom;
	printf("\n");
	print_table(device_titles, SD_N,
		    1u << SD_TENSORS | 1u << SD_USED | 1u << SD_CAPACITY | 1u << SD_USE |
			    1u << SD_GPU,
		    &s, s.r.n, device_cell);
	free(s.r.key);
	if (rows_of(v, n, TENSORD_SCOPE_UID, 1, &s.r) < 0)
		goto oom;
	printf("\n");
	print_table(uid_titles, SU_N, ~(1u << SU_USER), &s, s.r.n, uid_cell);
	free(s.r.key);
	return 0;
oom:
	fprintf(stderr, "tensorctl: stats: out of memory\n");
	return -1;
}
