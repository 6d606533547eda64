/*
 * tensorctl's commands: one libtensord call (or two) each, with what they
 * print left to output.c (put and get: checkpoint.c). Each returns the
 * exit status and reports its own failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tensorctl.h"

int cmd_ls(tensord_client *c, const struct args *a)
{
	tensord_info *infos = NULL;
	size_t i, n = 0;
	int rc;

	rc = tensord_list(c, a->npos ? a->pos[0] : NULL, &infos, &n);
	if (rc < 0)
		return op_error(rc, NULL);
	if (a->group) {
		rc = print_ls_groups(infos, n, a->group, a->seen & OPT_JSON);
		free(infos);
		return rc ? rc : finish_output();
	}
	if (a->seen & OPT_JSON) {
		putchar('[');
		for (i = 0; i < n; i++)
			json_info(&infos[i], i + 1 < n ? ",\n " : "");
		puts("]");
	} else {
		print_ls_table(infos, n);
	}
	free(infos);
	return finish_output();
}

int cmd_stat(tensord_client *c, const struct args *a)
{
	tensord_info info;
	int rc;

	if (a->pos[0][0] == '@') {
		/*
		 * Another node's tensor: what an attach gets (the node's current
		 * version, pulled when this node holds no replica known to be
		 * current), its version as that node numbers it (docs/remote.md).
		 */
		DLManagedTensorVersioned *t;

		rc = tensord_attach(c, a->pos[0], 0, &t);
		if (rc == 0) {
			rc = tensord_tensor_info(t, &info);
			t->deleter(t);
		}
	} else {
		rc = tensord_stat(c, a->pos[0], &info);
	}
	if (rc < 0)
		return op_error(rc, a->pos[0]);
	if (a->seen & OPT_JSON)
		json_info(&info, "\n");
	else
		print_info(&info);
	return finish_output();
}

int cmd_stats(tensord_client *c, const struct args *a)
{
	tensord_figure *v;
	char *json;
	size_t n;
	int rc;

	if (__builtin_popcount(a->seen & (OPT_PROMETHEUS | OPT_JSON | OPT_RAW)) > 1) {
		fprintf(stderr,
			"tensorctl: stats: --json, --prometheus and --raw exclude each other\n");
		return EXIT_USAGE;
	}
	if (a->seen & OPT_PROMETHEUS)
		return print_prometheus(c);
	if (a->seen & OPT_JSON) {
		rc = tensord_stats_json(c, &json);
		if (rc < 0)
			return op_error(rc, NULL);
		printf("%s\n", json);
		free(json);
		return finish_output();
	}
	rc = tensord_figures(c, &v, &n);
	if (rc < 0)
		return op_error(rc, NULL);
	rc = (a->seen & OPT_RAW) ? print_figures_text(v, n) : print_stats_summary(v, n);
	free(v);
	return rc < 0 ? EXIT_OP : finish_output();
}

/* The names rm removes, each once however often named. */
struct name_list {
	char **v;
	size_t n, cap;
};

static int name_list_add(struct name_list *l, const char *name)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		char **v = realloc(l->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		l->v = v;
		l->cap = cap;
	}
	if (!(l->v[l->n] = strdup(name)))
		return -ENOMEM;
	l->n++;
	return 0;
}

static void name_list_free(struct name_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Adds every name under prefix to l; 0 or the exit status after reporting. */
static int rm_add_prefix(tensord_client *c, struct name_list *l, const char *prefix)
{
	tensord_info *infos = NULL;
	char msg[768], q[QUOTE_MAX];
	size_t i, n = 0;
	int rc;

	rc = tensord_list(c, prefix, &infos, &n);
	if (rc < 0)
		return op_error(rc, prefix);
	for (i = 0, rc = 0; i < n && rc == 0; i++)
		rc = name_list_add(l, infos[i].name);
	free(infos);
	if (rc < 0)
		return report(rc, "out of memory", NULL);
	if (n > 0)
		return 0;
	snprintf(msg, sizeof(msg),
		 "no tensor you can see has a name under prefix %s; nothing was removed",
		 quote(prefix, QUOTE_MSG, q, sizeof(q)));
	return report(-ENOENT, msg, NULL);
}

/* Unlinks the n names v (sorted, unique) in one transaction; 0 or the exit status. */
static int rm_commit(tensord_client *c, char *const *v, size_t n, uint64_t *ret_commit)
{
	const char *failed = NULL;
	char msg[768];
	tensord_tx *tx;
	int rc;

	rc = tensord_tx_begin(c, &tx);
	if (rc < 0)
		return op_error(rc, NULL);
	for (size_t i = 0; i < n && !failed; i++)
		if ((rc = tensord_tx_unlink(tx, v[i])) < 0)
			failed = v[i];
	if (failed)
		tensord_tx_abort(tx);
	else
		rc = tensord_tx_commit(tx, ret_commit);
	tensord_tx_free(tx);
	if (rc == 0)
		return 0;
	/* A staged unlink's failure names its tensor; a failed commit's message its own. */
	snprintf(msg, sizeof(msg), "%s; nothing was removed", errmsg(rc));
	return report(rc, msg, failed);
}

/*
 * rm NAME... and rm --prefix PREFIX...: every name unlinked in one
 * transaction, so in one commit, or none of them when one cannot be.
 */
int cmd_rm(tensord_client *c, const struct args *a)
{
	struct name_list l = { 0 };
	uint64_t commit = 0;
	size_t i, n = 0;
	int rc = 0;

	for (int p = 0; p < a->npos && rc == 0; p++) {
		if (a->seen & OPT_PREFIX)
			rc = rm_add_prefix(c, &l, a->pos[p]);
		else if (name_list_add(&l, a->pos[p]) < 0)
			rc = report(-ENOMEM, "out of memory", NULL);
	}
	if (rc == 0) {
		qsort(l.v, l.n, sizeof(*l.v), cmp_str);
		for (i = 0; i < l.n; i++)
			if (n == 0 || strcmp(l.v[n - 1], l.v[i]) != 0)
				l.v[n++] = l.v[i];
			else
				free(l.v[i]);
		l.n = n;
		rc = rm_commit(c, l.v, l.n, &commit);
	}
	if (rc == 0 && (a->seen & OPT_JSON)) {
		printf("{\"removed\": %zu, \"commit\": %" PRIu64 "}\n", l.n, commit);
		rc = finish_output();
	}
	name_list_free(&l);
	return rc;
}

int cmd_wait(tensord_client *c, const struct args *a)
{
	DLManagedTensorVersioned *t;
	tensord_info info;
	int rc;

	rc = tensord_attach(c, a->pos[0], a->timeout_ms, &t);
	if (rc < 0)
		return op_error(rc, a->pos[0]);
	rc = (a->seen & OPT_JSON) ? tensord_tensor_info(t, &info) : 0;
	t->deleter(t);
	if (rc < 0)
		return op_error(rc, a->pos[0]);
	if (!(a->seen & OPT_JSON))
		return 0;
	json_info(&info, "\n");
	return finish_output();
}
