/*
 * tensorctl's commands: one libtensord call (or two) each, with what they
 * print left to output.c (put and get: checkpoint.c). Each returns the
 * exit status and reports its own failure.
 */
#include <errno.h>
#include <fcntl.h>
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

	if ((a->seen & OPT_PROMETHEUS) && (a->seen & OPT_JSON)) {
		fprintf(stderr, "tensorctl: stats: --json and --prometheus exclude each other\n");
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
	rc = print_figures_text(v, n);
	free(v);
	return rc < 0 ? EXIT_OP : finish_output();
}

int cmd_rm(tensord_client *c, const struct args *a)
{
	int rc = tensord_unlink(c, a->pos[0]);

	return rc < 0 ? op_error(rc, a->pos[0]) : 0;
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
