/*
 * Figures to Prometheus text: one family per figure, "tensord_" and its
 * name, with HELP and TYPE; a histogram as its cumulative _bucket samples,
 * _sum and _count. Label values are escaped as the format asks (\\, \" and
 * \n): some come from outside (a backend's path, an errno's name).
 */
#include "prometheus.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "conn.h"
#include "figures.h"
#include "proto/tensord.pb-c.h"
#include "reply.h"
#include "server.h"

static const char *const type_names[] = {
	[FIGURE_COUNTER] = "counter",
	[FIGURE_GAUGE] = "gauge",
	[FIGURE_HISTOGRAM] = "histogram",
};

static void label_value(FILE *f, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			fputc('\\', f);
		if (*v == '\n')
			fputs("\\n", f);
		else
			fputc(*v, f);
	}
}

/* {a="x",b="y"} for p's labels, with extra (le="...") last when not NULL. */
static void labels(FILE *f, const struct figure *fig, const struct figure_sample *p,
		   const char *extra)
{
	if (!fig->n_labels && !extra)
		return;
	fputc('{', f);
	for (unsigned i = 0; i < fig->n_labels; i++) {
		fprintf(f, "%s%s=\"", i ? "," : "", fig->labels[i]);
		label_value(f, p->values[i]);
		fputc('"', f);
	}
	if (extra)
		fprintf(f, "%sle=\"%s\"", fig->n_labels ? "," : "", extra);
	fputc('}', f);
}

static void value(FILE *f, const struct figure *fig, double v)
{
	if (fig->unit == FIGURE_SECONDS)
		fprintf(f, " %.9f\n", v);
	else
		fprintf(f, " %.0f\n", v);
}

static void histogram(FILE *f, const struct figure *fig, const struct figure_sample *p)
{
	uint64_t cum = 0;
	char le[32];

	for (unsigned b = 0; b <= p->n_bounds; b++) {
		cum += p->counts[b];
		if (b < p->n_bounds)
			snprintf(le, sizeof(le), "%g", p->bounds[b]);
		else
			snprintf(le, sizeof(le), "+Inf");
		fprintf(f, "tensord_%s_bucket", fig->name);
		labels(f, fig, p, le);
		fprintf(f, " %llu\n", (unsigned long long)cum);
	}
	fprintf(f, "tensord_%s_sum", fig->name);
	labels(f, fig, p, NULL);
	fprintf(f, " %.9f\n", p->value);
	fprintf(f, "tensord_%s_count", fig->name);
	labels(f, fig, p, NULL);
	fprintf(f, " %llu\n", (unsigned long long)cum);
}

int prometheus_text(const struct figure_set *set, char **ret, size_t *ret_len)
{
	char *text = NULL;
	size_t len = 0, k = 0;
	FILE *f = open_memstream(&text, &len);
	int r;

	if (!f)
		return -ENOMEM;
	/* The samples come in table order: one pass. */
	for (unsigned i = 0; i < FIG_COUNT; i++) {
		const struct figure *fig = &figures[i];

		if (set->absent[i])
			continue;
		fprintf(f, "# HELP tensord_%s %s\n# TYPE tensord_%s %s\n", fig->name, fig->help,
			fig->name, type_names[fig->type]);
		for (; k < set->n && set->v[k].id == fig->id; k++) {
			const struct figure_sample *p = &set->v[k];

			if (fig->type == FIGURE_HISTOGRAM) {
				histogram(f, fig, p);
				continue;
			}
			fprintf(f, "tensord_%s", fig->name);
			labels(f, fig, p, NULL);
			value(f, fig, p->value);
		}
	}
	r = ferror(f) ? -ENOMEM : 0;
	if (fclose(f) != 0 || r < 0) {
		free(text);
		return -ENOMEM;
	}
	*ret = text;
	*ret_len = len;
	return 0;
}

static int render(const struct server *srv, int64_t viewer, char **ret, size_t *ret_len)
{
	struct figure_set set;
	int r;

	figures_collect(srv, viewer, &set);
	r = prometheus_text(&set, ret, ret_len);
	figures_release(&set);
	return r;
}

int prometheus_render(const struct server *srv, char **ret, size_t *ret_len)
{
	return render(srv, srv->cfg.metrics_per_uid ? FIGURES_VIEW_ALL : FIGURES_VIEW_NONE, ret,
		      ret_len);
}

void prometheus_reply(struct conn *c, uint64_t req_id, const struct server *srv)
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
