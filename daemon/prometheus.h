/*
 * The Prometheus text exposition (format 0.0.4) of the daemon's figures,
 * for the --metrics endpoint and the Metrics request. The text is written
 * here by hand: it is a few lines of "name{labels} value", and the only
 * Prometheus client library Debian packages for C-family code
 * (prometheus-cpp) is C++ and brings its own HTTP server thread; none fits
 * a C daemon on one libuv loop (docs/operating.md says more).
 */
#ifndef TENSORD_PROMETHEUS_H
#define TENSORD_PROMETHEUS_H

#include <stddef.h>
#include <stdint.h>

struct conn;
struct figure_set;
struct server;

/*
 * The text of set. On success *ret is malloc'ed and NUL-terminated, owned
 * by the caller (free()), and *ret_len its length. 0 or -ENOMEM.
 */
int prometheus_text(const struct figure_set *set, char **ret, size_t *ret_len);

/*
 * The text of srv as the HTTP endpoint serves it: the per-uid figures only
 * with --metrics-per-uid (cfg.metrics_per_uid), since anyone who reaches
 * the endpoint reads it. As prometheus_text().
 */
int prometheus_render(const struct server *srv, char **ret, size_t *ret_len);

/* Answers a Metrics request on c with the text of srv as c's uid may see it. */
void prometheus_reply(struct conn *c, uint64_t req_id, const struct server *srv);

#endif
