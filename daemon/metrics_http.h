/*
 * The metrics endpoint (--metrics ADDR): a minimal HTTP/1.0 server on the
 * daemon's loop that answers GET /metrics with the exposition text and
 * closes. ADDR is HOST:PORT (numeric IPv4, [IPv6], or localhost) or
 * unix:PATH. Off unless asked for.
 *
 * Bounds: a request head of at most METRICS_HTTP_REQUEST_MAX bytes, within
 * METRICS_HTTP_TIMEOUT_MS, METRICS_HTTP_CONNS_MAX connections at once and
 * METRICS_HTTP_CONNS_PER_PEER of one peer (its address over TCP, its uid
 * over a unix socket). A connection past either bound takes the place of
 * the oldest one still sending its request (of that peer, or of anyone when
 * all are taken), so idle connections cannot keep a scraper out: one that
 * sends its request at once is answered at once. A scraper that stalls or
 * floods costs the daemon a few KiB and never blocks its clients.
 *
 * It is a transport: the text comes from the render callback main.c sets.
 */
#ifndef TENSORD_METRICS_HTTP_H
#define TENSORD_METRICS_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#define METRICS_HTTP_REQUEST_MAX 4096
#define METRICS_HTTP_TIMEOUT_MS 5000
#define METRICS_HTTP_CONNS_MAX 16
#define METRICS_HTTP_CONNS_PER_PEER 4

/* The text to serve: 0 with *ret malloc'ed (the endpoint frees it), or -errno. */
typedef int metrics_render_fn(void *ctx, char **ret, size_t *ret_len);

/*
 * Starts serving on addr. A unix socket gets mode and gid (gid (gid_t)-1:
 * left as is), like the daemon's own; a stale one is replaced, a live one
 * is not. share_port: a TCP port is bound with SO_REUSEPORT, so that a
 * daemon under a holder binds it while its drained predecessor still
 * does (docs/restart.md section 6; the kernel lets only the same uid
 * share it). 0, or -errno with the reason in why.
 */
int metrics_http_start(uv_loop_t *loop, const char *addr, mode_t mode, gid_t gid, bool share_port,
		       metrics_render_fn *render, void *ctx, char *why, size_t why_len);

/* Stops listening, closes every connection, removes a unix socket. Safe when not started. */
void metrics_http_stop(void);

/* Who is at the other end: an address over TCP, a uid over a unix socket. */
struct metrics_http_peer {
	int family;       /* AF_INET, AF_INET6, AF_UNIX; 0: unknown (all such are one) */
	uint8_t addr[16]; /* the address's bytes; AF_UNIX: the uid, from SO_PEERCRED */
};

/* An open connection, as metrics_http_victim() weighs it. */
struct metrics_http_slot {
	struct metrics_http_peer peer;
	bool answered; /* its request came and its answer is on the way */
	uint64_t seq;  /* accept order: smaller is older */
};

/*
 * Where a new connection from peer goes, given the n open ones in v: -1
 * when there is room; else the index in v of the one to close for it (the
 * oldest of peer's that is not answered yet when peer has
 * METRICS_HTTP_CONNS_PER_PEER open, else the oldest not answered of all
 * when METRICS_HTTP_CONNS_MAX are open); -2 when there is none to close
 * (all answered): the new one is refused. Pure, for tests.
 */
int metrics_http_victim(const struct metrics_http_slot *v, size_t n,
			const struct metrics_http_peer *peer);

/*
 * The status to answer a request head with: 0 while it is incomplete,
 * 200 for GET /metrics (a query string is ignored), 404 for another path,
 * 405 for another method, 400 when it is not HTTP. Pure, for tests.
 */
int metrics_http_parse(const char *buf, size_t len);

#endif
