/*
 * --group prefix|commit for ls and leases: the rows of a listing folded
 * into one per prefix (a name up to its last '/') or per commit, with how
 * many tensors and bytes each holds, so a set of 32 tensors is one row,
 * not 32. leases keeps the holders apart: a row per connection and
 * prefix (or commit). docs/tensorctl.md, "Groups", describes the formats.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorctl.h"

/* The length of name's prefix: up to and including its last '/'; 0 when it has none. */
size_t group_prefix_len(const char *name)
{
	const char *slash = strrchr(name, '/');

	return slash ? (size_t)(slash - name) + 1 : 0;
}

/*
 * Folds name into the common prefix kept in p (len *plen; first: take
 * the name's own prefix), cut back to a '/' so that it reads as a prefix.
 */
void group_common_prefix(char *p, size_t *plen, const char *name, bool first)
{
	size_t n = 0;

	if (first) {
		n = group_prefix_len(name);
		memcpy(p, name, n);
	} else {
		while (n < *plen && name[n] == p[n])
			n++;
		while (n && p[n - 1] != '/')
			n--;
	}
	p[n] = '\0';
	*plen = n;
}

/* One row of a grouped listing. */
struct group {
	uint64_t commit;                   /* GROUP_COMMIT: the key; else the newest */
	uint64_t commit_min;               /* GROUP_PREFIX: the oldest */
	char prefix[TENSORD_NAME_MAX + 1]; /* GROUP_PREFIX: the key; else the common prefix */
	size_t prefix_len;
	size_t tensors;
	uint64_t bytes;
	/* leases: the holder, and what it holds of the group */
	const tensord_lease_holder *h; /* the first: pid, uid, comm, label */
	uint64_t leases, held_ns;
	int state; /* a tensord_state, or -1 when the group mixes them */
};

struct groups {
	struct group *v;
	size_t n, cap;
	enum group_by by;
};

/* The group for (conn, prefix or commit), added when new; NULL when out of memory. */
static struct group *group_find(struct groups *g, uint64_t conn, const char *name, uint64_t commit,
				const tensord_lease_holder *h)
{
	size_t plen = group_prefix_len(name);
	struct group *x;

	/* Rows come sorted by name or commit: the last group is the one to grow. */
	for (size_t i = g->n; i-- > 0;) {
		x = &g->v[i];
		if ((h ? x->h->conn_id : 0) != conn)
			continue;
		if (g->by == GROUP_COMMIT ? x->commit == commit
					  : x->prefix_len == plen && !memcmp(x->prefix, name, plen))
			return x;
	}
	if (g->n == g->cap) {
		size_t cap = g->cap ? 2 * g->cap : 16;
		struct group *v = realloc(g->v, cap * sizeof(*v));

		if (!v)
			return NULL;
		g->v = v;
		g->cap = cap;
	}
	x = &g->v[g->n++];
	memset(x, 0, sizeof(*x));
	x->commit = commit;
	x->commit_min = commit;
	x->h = h;
	x->state = h ? (int)h->state : 0;
	if (g->by == GROUP_PREFIX) {
		memcpy(x->prefix, name, plen);
		x->prefix[plen] = '\0';
		x->prefix_len = plen;
	}
	return x;
}

/* Adds one tensor (of a holder, or NULL) to its group; 0 or -ENOMEM. */
static int group_add(struct groups *g, const char *name, uint64_t commit, uint64_t bytes,
		     const tensord_lease_holder *h)
{
	struct group *x = group_find(g, h ? h->conn_id : 0, name, commit, h);

	if (!x)
		return -ENOMEM;
	if (g->by == GROUP_COMMIT)
		group_common_prefix(x->prefix, &x->prefix_len, name, x->tensors == 0);
	if (commit > x->commit)
		x->commit = commit;
	if (commit < x->commit_min)
		x->commit_min = commit;
	x->tensors++;
	x->bytes += bytes;
	if (h) {
		x->leases += h->count;
		if (h->held_ns > x->held_ns)
			x->held_ns = h->held_ns;
		if (x->state != (int)h->state)
			x->state = -1;
	}
	return 0;
}

static const char *u64s(uint64_t v, char *buf, size_t len)
{
	snprintf(buf, len, "%" PRIu64, v);
	return buf;
}

static const char *commit_cell(const struct group *x, enum group_by by, char *buf, size_t len)
{
	if (!x->commit)
		return "-";
	if (by == GROUP_PREFIX && x->commit_min != x->commit)
		snprintf(buf, len, "%" PRIu64 "-%" PRIu64, x->commit_min, x->commit);
	else
		snprintf(buf, len, "%" PRIu64, x->commit);
	return buf;
}

static void json_group(const struct group *x, const char *end)
{
	printf("{\"prefix\": ");
	json_str(x->prefix);
	printf(", \"commit\": %" PRIu64 ", \"tensors\": %zu, \"bytes\": %" PRIu64, x->commit,
	       x->tensors, x->bytes);
	if (x->commit_min != x->commit)
		printf(", \"commit_min\": %" PRIu64, x->commit_min);
	if (x->h) {
		printf(", \"conn_id\": %" PRIu64 ", \"pid\": %" PRIu32 ", \"uid\": %" PRIu32,
		       x->h->conn_id, x->h->pid, x->h->uid);
		json_field("comm", x->h->comm, false);
		json_field("label", x->h->label, false);
		printf(", \"state\": \"%s\", \"leases\": %" PRIu64 ", \"held_ns\": %" PRIu64,
		       x->state < 0 ? "mixed" : state_name((tensord_state)x->state), x->leases,
		       x->held_ns);
	}
	printf("}%s", end);
}

/* --- ls --group ----------------------------------------------------------------- */

static const struct groups *cell_groups;

enum { LG_KEY, LG_TENSORS, LG_BYTES, LG_OTHER, LG_N };

static const char *ls_group_cell(const void *rows, size_t i, int col, char *buf, size_t len)
{
	const struct group *x = (const struct group *)rows + i;
	enum group_by by = cell_groups->by;

	switch (col) {
	case LG_KEY:
		if (by == GROUP_PREFIX)
			return *x->prefix ? x->prefix : "-";
		return commit_cell(x, by, buf, len);
	case LG_TENSORS:
		return u64s(x->tensors, buf, len);
	case LG_BYTES:
		return human(x->bytes, buf, len);
	default:
		if (by == GROUP_PREFIX)
			return commit_cell(x, by, buf, len);
		return *x->prefix ? x->prefix : "-";
	}
}

/* Groups by holder (connection), then prefix or commit. */
static enum group_by sort_by;

static int cmp_group(const void *a, const void *b)
{
	const struct group *x = a, *y = b;
	uint64_t cx = x->h ? x->h->conn_id : 0, cy = y->h ? y->h->conn_id : 0;

	if (cx != cy)
		return cx < cy ? -1 : 1;
	if (sort_by == GROUP_COMMIT && x->commit != y->commit)
		return x->commit < y->commit ? -1 : 1;
	return strcmp(x->prefix, y->prefix);
}

static void print_groups(struct groups *g, bool json, const char *const *titles, int ncol,
			 unsigned right, table_cell_fn *cell)
{
	sort_by = g->by;
	if (g->n > 1)
		qsort(g->v, g->n, sizeof(*g->v), cmp_group);
	if (json) {
		putchar('[');
		for (size_t i = 0; i < g->n; i++)
			json_group(&g->v[i], i + 1 < g->n ? ",\n " : "");
		puts("]");
		return;
	}
	cell_groups = g;
	print_table(titles, ncol, right, g->v, g->n, cell);
}

static int cmp_info_commit(const void *a, const void *b)
{
	const tensord_info *x = a, *y = b;

	if (x->commit != y->commit)
		return x->commit < y->commit ? -1 : 1;
	return strcmp(x->name, y->name);
}

int print_ls_groups(tensord_info *infos, size_t n, enum group_by by, bool json)
{
	static const char *const by_prefix[LG_N] = { "PREFIX", "TENSORS", "BYTES", "COMMIT" };
	static const char *const by_commit[LG_N] = { "COMMIT", "TENSORS", "BYTES", "PREFIX" };
	struct groups g = { .by = by };
	int rc = 0;

	/* ls lists in name order, which groups prefixes together; commits are sorted here. */
	if (by == GROUP_COMMIT && n > 1)
		qsort(infos, n, sizeof(*infos), cmp_info_commit);
	for (size_t i = 0; i < n && rc == 0; i++)
		rc = group_add(&g, infos[i].name, infos[i].commit, infos[i].nbytes, NULL);
	if (rc == 0)
		print_groups(&g, json, by == GROUP_PREFIX ? by_prefix : by_commit, LG_N,
			     1u << LG_TENSORS | 1u << LG_BYTES | (by == GROUP_COMMIT ? 1u : 0),
			     ls_group_cell);
	free(g.v);
	return rc < 0 ? report(rc, "out of memory", NULL) : 0;
}

/* --- leases --group ------------------------------------------------------------- */

enum {
	HG_KEY,
	HG_OTHER,
	HG_TENSORS,
	HG_BYTES,
	HG_STATE,
	HG_PID,
	HG_USER,
	HG_COMM,
	HG_LABEL,
	HG_LEASES,
	HG_HELD,
	HG_N
};

static const char *holder_group_cell(const void *rows, size_t i, int col, char *buf, size_t len)
{
	const struct group *x = (const struct group *)rows + i;

	switch (col) {
	case HG_KEY:
	case HG_OTHER:
		return ls_group_cell(rows, i, col == HG_KEY ? LG_KEY : LG_OTHER, buf, len);
	case HG_TENSORS:
		return u64s(x->tensors, buf, len);
	case HG_BYTES:
		return human(x->bytes, buf, len);
	case HG_STATE:
		return x->state < 0 ? "mixed" : state_name((tensord_state)x->state);
	case HG_PID:
		return u64s(x->h->pid, buf, len);
	case HG_USER:
		return owner_name(x->h->uid, buf, len);
	case HG_COMM:
		return *x->h->comm ? x->h->comm : "-";
	case HG_LABEL:
		return *x->h->label ? x->h->label : "-";
	case HG_LEASES:
		return u64s(x->leases, buf, len);
	default:
		return duration(x->held_ns, buf, len);
	}
}

/* By connection, then name (prefix) or commit. */
static enum group_by holder_sort_by;

static int cmp_holder_group(const void *a, const void *b)
{
	const tensord_lease_holder *x = a, *y = b;

	if (x->conn_id != y->conn_id)
		return x->conn_id < y->conn_id ? -1 : 1;
	if (holder_sort_by == GROUP_COMMIT && x->commit != y->commit)
		return x->commit < y->commit ? -1 : 1;
	return strcmp(x->name, y->name);
}

int print_lease_groups(tensord_lease_holder *v, size_t n, enum group_by by, bool json)
{
	static const char *const by_prefix[HG_N] = { "PREFIX", "COMMIT", "TENSORS", "BYTES",
						     "STATE",  "PID",    "USER",    "COMM",
						     "LABEL",  "LEASES", "HELD" };
	static const char *const by_commit[HG_N] = { "COMMIT", "PREFIX", "TENSORS", "BYTES",
						     "STATE",  "PID",    "USER",    "COMM",
						     "LABEL",  "LEASES", "HELD" };
	struct groups g = { .by = by };
	int rc = 0;

	holder_sort_by = by;
	if (n > 1)
		qsort(v, n, sizeof(*v), cmp_holder_group);
	for (size_t i = 0; i < n && rc == 0; i++)
		rc = group_add(&g, v[i].name, v[i].commit, v[i].bytes, &v[i]);
	if (rc == 0)
		print_groups(&g, json, by == GROUP_PREFIX ? by_prefix : by_commit, HG_N,
			     1u << HG_TENSORS | 1u << HG_BYTES | 1u << HG_PID | 1u << HG_LEASES |
				     1u << HG_HELD | (by == GROUP_COMMIT ? 1u : 2u),
			     holder_group_cell);
	free(g.v);
	return rc < 0 ? report(rc, "out of memory", NULL) : 0;
}
