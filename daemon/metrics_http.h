/*
 * The metrics endpoint (--metrics ADDR): a minimal HTTP/1.0 server on the
 * daemon's loop that answers GET /metrics with the exposition text and
 * closes. ADDR is HOST:PORT (numeric IPv4, [IPv6], or localhost) or
 * unix:PATH. Off unless asked for.
 *
 * Bounds: a request head of at most METRICS_HTTP_REQUEST_MAX bytes, within
 * METRICS_HTTP_TIMEOUT_MS, and METRICS_HTTP_CONNS_MAX connections at once
 * (more are closed at accept), so a scraper that stalls or floods costs
 * the daemon a few KiB and never blocks its clients.
 *
 * It is a transport: the text comes from the render callback main.c sets.
 */
#ifndef TENSORD_METRICS_HTTP_H
#define TENSORD_METRICS_HTTP_H

#include <stddef.h>
#include <sys/types.h>

#include <uv.h>

#define METRICS_HTTP_REQUEST_MAX 4096
#define METRICS_HTTP_TIMEOUT_MS 5000
#define METRICS_HTTP_CONNS_MAX 16

/* The text to serve: 0 with *ret malloc'ed (the endpoint frees it), or -errno. */
typedef int metrics_render_fn(void *ctx, char **ret, size_t *ret_len);

/*
 * Starts serving on addr. A unix socket gets mode and gid (gid (gid_t)-1:
 * left as is), like the daemon's own; a stale one is replaced, a live one
 * is not. 0, or -errno with the reason in why.
 */
int metrics_http_start(uv_loop_t *loop, const char *addr, mode_t mode, gid_t gid,
		       metrics_render_fn *render, void *ctx, char *why, size_t why_len);

/* Stops listening, closes every connection, removes a unix socket. Safe when not started. */
void metrics_http_stop(void);

/*
 * The status to answer a request head with: 0 while it is incomplete,
 * 200 for GET /metrics (a query string is ignored), 404 for another path,
 * 405 for another method, 400 when it is not HTTP. Pure, for tests.
 */
int metrics_http_parse(const char *buf, size_t len);

#endif
