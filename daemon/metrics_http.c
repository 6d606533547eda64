/*
 * The metrics endpoint: HTTP/1.0, one request per connection, GET /metrics
 * only. Prometheus scrapes with a plain GET and reads to the end, so this
 * is all the HTTP a scrape needs; anything else is answered with a status
 * and closed. There is one endpoint per daemon, so its state is one
 * file-scope struct.
 *
 * Each connection owns two handles (the stream and its deadline timer) and
 * is freed when both are closed; the stream is shut down before it is
 * closed, so the response is never cut off by a reset.
 *
 * Slowloris: connections that open and never finish their request would
 * take every slot until their deadlines, and a scraper arriving meanwhile
 * was closed at accept. Now a newcomer past the bounds takes the slot of
 * the oldest unfinished request (metrics_http_victim()), first among its
 * own peer's, so a peer can hold only METRICS_HTTP_CONNS_PER_PEER slots and
 * a scraper that sends its request at once is served. Over TCP the peer is
 * the address, so local users share 127.0.0.1; the eviction still lets the
 * newest in, and over a unix socket each uid has its own share.
 */
#include "metrics_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/base/log.h"
#include "server.h"

union stream {
	uv_handle_t handle;
	uv_stream_t stream;
	uv_tcp_t tcp;
	uv_pipe_t pipe;
};

struct http_conn {
	union stream s;
	uv_timer_t timer;
	uv_write_t wr;
	uv_shutdown_t sd;
	int open_handles; /* s and timer; freed when both are closed */
	bool closing, answered;
	struct metrics_http_peer peer;
	uint64_t seq; /* accept order */
	char *body;   /* owned; what is being sent */
	char head[256];
	size_t in_len;
	LIST_ENTRY(http_conn) link; /* ep.list */
	char in[METRICS_HTTP_REQUEST_MAX];
};

static struct {
	uv_loop_t *loop;
	union stream lsn;
	bool listening, is_unix;
	char path[108];
	metrics_render_fn *render;
	void *ctx;
	unsigned n_conns; /* closing ones too, until freed */
	uint64_t next_seq;
	LIST_HEAD(, http_conn) list; /* every connection, closing ones too */
} ep;

int metrics_http_parse(const char *buf, size_t len)
{
	const char *eol = memchr(buf, '\n', len), *sp, *path, *pend, *q;
	size_t line, plen;

	/* The head ends with an empty line; bare LFs are tolerated. */
	if (!memmem(buf, len, "\r\n\r\n", 4) && !memmem(buf, len, "\n\n", 2))
		return 0;
	line = (size_t)(eol - buf);
	sp = memchr(buf, ' ', line);
	if (!sp)
		return 400;
	path = sp + 1;
	pend = memchr(path, ' ', (size_t)(buf + line - path));
	if (!pend || (size_t)(buf + line - pend) < 6 || memcmp(pend + 1, "HTTP/", 5) != 0)
		return 400;
	if (sp - buf != 3 || memcmp(buf, "GET", 3) != 0)
		return 405;
	plen = (size_t)(pend - path);
	q = memchr(path, '?', plen);
	if (q)
		plen = (size_t)(q - path);
	return plen == 8 && memcmp(path, "/metrics", 8) == 0 ? 200 : 404;
}

/* hc goes on the list, where hc_closed() finds it. */
static void hc_link(struct http_conn *hc)
{
	LIST_INSERT_HEAD(&ep.list, hc, link);
	ep.n_conns++;
}

static void hc_closed(uv_handle_t *h)
{
	struct http_conn *hc = h->data;

	if (--hc->open_handles)
		return;
	LIST_REMOVE(hc, link);
	ep.n_conns--;
	free(hc->body);
	free(hc);
}

static void hc_close(struct http_conn *hc)
{
	if (hc->closing)
		return;
	hc->closing = true;
	uv_close(&hc->s.handle, hc_closed);
	uv_close((uv_handle_t *)&hc->timer, hc_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
	hc_close(req->data);
}

static void on_written(uv_write_t *req, int status)
{
	struct http_conn *hc = req->data;

	if (hc->closing)
		return;
	hc->sd.data = hc;
	if (status < 0 || uv_shutdown(&hc->sd, &hc->s.stream, on_shutdown) < 0)
		hc_close(hc);
}

static const char *reason(int status)
{
	switch (status) {
	case 200:
		return "OK";
	case 404:
		return "Not Found";
	case 405:
		return "Method Not Allowed";
	case 431:
		return "Request Header Fields Too Large";
	case 500:
		return "Internal Server Error";
	default:
		return "Bad Request";
	}
}

static void respond(struct http_conn *hc, int status)
{
	size_t len = 0;
	uv_buf_t b[2];
	int n;

	hc->answered = true;
	uv_read_stop(&hc->s.stream);
	if (status == 200 && ep.render(ep.ctx, &hc->body, &len) < 0)
		status = 500;
	if (status != 200) {
		/* The body says what this endpoint serves. */
		hc->body = NULL;
		len = 0;
	}
	n = snprintf(hc->head, sizeof(hc->head),
		     "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
		     "Connection: close\r\n\r\n%s",
		     status, reason(status),
		     status == 200 ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain",
		     status == 200 ? len : strlen("tensord serves GET /metrics\n"),
		     status == 200 ? "" : "tensord serves GET /metrics\n");
	b[0] = uv_buf_init(hc->head, (unsigned)n);
	b[1] = uv_buf_init(hc->body ? hc->body : (char *)"", (unsigned)len);
	hc->wr.data = hc;
	if (uv_write(&hc->wr, &hc->s.stream, b, 2, on_written) < 0)
		hc_close(hc);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct http_conn *hc = h->data;

	/* A full buffer gives a length of 0, which libuv reports as UV_ENOBUFS. */
	*buf = uv_buf_init(hc->in + hc->in_len, (unsigned)(sizeof(hc->in) - hc->in_len));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct http_conn *hc = s->data;
	int status;

	if (hc->closing || hc->answered)
		return;
	if (nread == UV_ENOBUFS) {
		respond(hc, 431);
	} else if (nread < 0) {
		hc_close(hc);
	} else if (nread > 0) {
		hc->in_len += (size_t)nread;
		status = metrics_http_parse(hc->in, hc->in_len);
		if (status)
			respond(hc, status);
	}
}

static void on_timeout(uv_timer_t *t)
{
	hc_close(t->data);
}

int metrics_http_victim(const struct metrics_http_slot *v, size_t n,
			const struct metrics_http_peer *peer)
{
	size_t mine = 0;
	int oldest = -1, oldest_mine = -1;

	for (size_t i = 0; i < n; i++) {
		bool same = v[i].peer.family == peer->family &&
			    memcmp(v[i].peer.addr, peer->addr, sizeof(peer->addr)) == 0;

		mine += same;
		if (v[i].answered)
			continue;
		if (oldest < 0 || v[i].seq < v[oldest].seq)
			oldest = (int)i;
		if (same && (oldest_mine < 0 || v[i].seq < v[oldest_mine].seq))
			oldest_mine = (int)i;
	}
	if (mine >= METRICS_HTTP_CONNS_PER_PEER)
		return oldest_mine >= 0 ? oldest_mine : -2;
	if (n >= METRICS_HTTP_CONNS_MAX)
		return oldest >= 0 ? oldest : -2;
	return -1;
}

/* Who hc's peer is; family 0 when that cannot be told. */
static void peer_of(struct http_conn *hc)
{
	struct sockaddr_storage ss;
	struct ucred cred;
	socklen_t len = sizeof(cred);
	int sl = sizeof(ss);
	uv_os_fd_t fd;

	memset(&hc->peer, 0, sizeof(hc->peer));
	if (ep.is_unix) {
		if (uv_fileno(&hc->s.handle, &fd) == 0 &&
		    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
			hc->peer.family = AF_UNIX;
			memcpy(hc->peer.addr, &cred.uid, sizeof(cred.uid));
		}
		return;
	}
	if (uv_tcp_getpeername(&hc->s.tcp, (struct sockaddr *)&ss, &sl) < 0)
		return;
	hc->peer.family = ss.ss_family;
	if (ss.ss_family == AF_INET)
		memcpy(hc->peer.addr, &((struct sockaddr_in *)&ss)->sin_addr, 4);
	else if (ss.ss_family == AF_INET6)
		memcpy(hc->peer.addr, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
}

/*
 * Makes room for hc, which is not yet on the list: closes the connection
 * it replaces, if one. false when there is none to close.
 */
static bool make_room(struct http_conn *hc)
{
	struct metrics_http_slot v[METRICS_HTTP_CONNS_MAX + 1];
	struct http_conn *who[METRICS_HTTP_CONNS_MAX + 1];
	size_t n = 0;
	int i;

	/* Those closing are gone already; at most the limit are not. */
	for (struct http_conn *c = LIST_FIRST(&ep.list); c && n < METRICS_HTTP_CONNS_MAX + 1;
	     c = LIST_NEXT(c, link)) {
		if (c->closing)
			continue;
		v[n] = (struct metrics_http_slot){ c->peer, c->answered, c->seq };
		who[n++] = c;
	}
	i = metrics_http_victim(v, n, &hc->peer);
	if (i == -2)
		return false;
	if (i >= 0) {
		log_debug("metrics: connection %llu closed, unfinished, for a newer one",
			  (unsigned long long)who[i]->seq);
		hc_close(who[i]);
	}
	return true;
}

static void on_connection(uv_stream_t *lsn, int status)
{
	struct http_conn *hc;

	if (status < 0) {
		log_warn("metrics: accept: %s, ignoring", uv_strerror(status));
		return;
	}
	hc = calloc(1, sizeof(*hc));
	if (!hc) {
		log_warn("metrics: out of memory for a connection, ignoring");
		return;
	}
	if (ep.is_unix)
		uv_pipe_init(ep.loop, &hc->s.pipe, 0);
	else
		uv_tcp_init(ep.loop, &hc->s.tcp);
	uv_timer_init(ep.loop, &hc->timer);
	hc->s.handle.data = hc->timer.data = hc;
	hc->open_handles = 2;
	hc->seq = ++ep.next_seq;
	if (uv_accept(lsn, &hc->s.stream) < 0) {
		hc_link(hc);
		hc_close(hc);
		return;
	}
	peer_of(hc);
	if (!make_room(hc)) {
		log_debug("metrics: connection refused: all %u are being answered", ep.n_conns);
		hc_link(hc);
		hc_close(hc);
		return;
	}
	hc_link(hc);
	uv_timer_start(&hc->timer, on_timeout, METRICS_HTTP_TIMEOUT_MS, 0);
	uv_read_start(&hc->s.stream, on_alloc, on_read);
}

/* "HOST:PORT" into *ss. 0, or -EINVAL with the reason. */
static int parse_tcp(const char *addr, struct sockaddr_storage *ss, char *why, size_t why_len)
{
	const char *colon = strrchr(addr, ':');
	size_t hl = colon ? (size_t)(colon - addr) : 0;
	unsigned long port;
	char host[64], *end;
	int r;

	if (!colon || !hl || hl >= sizeof(host)) {
		snprintf(why, why_len, "'%s': use HOST:PORT or unix:PATH", addr);
		return -EINVAL;
	}
	memcpy(host, addr, hl);
	host[hl] = '\0';
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (!colon[1] || *end || errno || port > 65535) {
		snprintf(why, why_len, "'%s': the port must be 0 to 65535", addr);
		return -EINVAL;
	}
	if (strcmp(host, "localhost") == 0)
		snprintf(host, sizeof(host), "127.0.0.1");
	if (host[0] == '[' && host[hl - 1] == ']') {
		host[hl - 1] = '\0';
		r = uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)ss);
	} else {
		r = uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss);
	}
	if (r < 0) {
		snprintf(why, why_len, "'%s': not a numeric address (127.0.0.1:9464, [::1]:9464)",
			 addr);
		return -EINVAL;
	}
	return 0;
}

static bool is_loopback(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET)
		return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
	return memcmp(&((const struct sockaddr_in6 *)ss)->sin6_addr, &in6addr_loopback,
		      sizeof(in6addr_loopback)) == 0;
}

/*
 * A TCP socket bound to ss with SO_REUSEPORT (libuv 1.44 binds without
 * it), for uv_tcp_open(): the descriptor, or -errno.
 */
static int bind_shared(const struct sockaddr_storage *ss)
{
	socklen_t len =
		ss->ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
	int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1, e;

	if (fd < 0)
		return -errno;
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) < 0 ||
	    bind(fd, (const struct sockaddr *)ss, len) < 0) {
		e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

static int listen_tcp(const char *addr, bool share_port, char *why, size_t why_len)
{
	struct sockaddr_storage ss = { 0 };
	int len = sizeof(ss), r, fd;
	char host[64] = "";

	r = parse_tcp(addr, &ss, why, why_len);
	if (r < 0)
		return r;
	uv_tcp_init(ep.loop, &ep.lsn.tcp);
	if (share_port) {
		fd = bind_shared(&ss);
		r = fd < 0 ? fd : uv_tcp_open(&ep.lsn.tcp, fd);
		if (r < 0 && fd >= 0)
			close(fd);
	} else {
		r = uv_tcp_bind(&ep.lsn.tcp, (const struct sockaddr *)&ss, 0);
	}
	if (r == 0)
		r = uv_listen(&ep.lsn.stream, 64, on_connection);
	if (r < 0) {
		snprintf(why, why_len, "'%s': %s", addr, uv_strerror(r));
		uv_close(&ep.lsn.handle, NULL);
		return r;
	}
	uv_tcp_getsockname(&ep.lsn.tcp, (struct sockaddr *)&ss, &len);
	if (ss.ss_family == AF_INET)
		uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof(host));
	else
		uv_ip6_name((struct sockaddr_in6 *)&ss, host, sizeof(host));
	log_info("metrics: serving http://%s%s%s:%u/metrics", ss.ss_family == AF_INET ? "" : "[",
		 host, ss.ss_family == AF_INET ? "" : "]",
		 ntohs(((struct sockaddr_in *)&ss)->sin_port));
	if (!is_loopback(&ss))
		log_warn("metrics: %s is not a loopback address: anyone who can reach this host "
			 "can read the metrics",
			 addr);
	return 0;
}

/* Binds path as the daemon's own socket is bound: stale replaced, mode set before use. */
static int listen_unix(const char *path, mode_t mode, gid_t gid, char *why, size_t why_len)
{
	char reason[600];
	int fd, r;

	if (!*path || strlen(path) >= sizeof(ep.path)) {
		snprintf(why, why_len, "unix:%s: the path must be 1 to %zu bytes", path,
			 sizeof(ep.path) - 1);
		return -EINVAL;
	}
	/* Bound as the daemon's own socket is: in a safe directory, never
	 * chmod'ed or chown'ed by name (listen.c). */
	fd = server_socket_bind(path, mode, gid, reason, sizeof(reason));
	if (fd < 0) {
		snprintf(why, why_len, "%s", reason);
		return fd;
	}
	snprintf(ep.path, sizeof(ep.path), "%s", path);
	uv_pipe_init(ep.loop, &ep.lsn.pipe, 0);
	r = uv_pipe_open(&ep.lsn.pipe, fd);
	if (r < 0)
		close(fd);
	else
		r = uv_listen(&ep.lsn.stream, 64, on_connection);
	if (r < 0) {
		snprintf(why, why_len, "unix:%s: %s", path, uv_strerror(r));
		uv_close(&ep.lsn.handle, NULL);
		server_socket_remove(path);
		return r;
	}
	ep.is_unix = true;
	log_info("metrics: serving GET /metrics on unix:%s (mode %03o)", path, (unsigned)mode);
	return 0;
}

int metrics_http_start(uv_loop_t *loop, const char *addr, mode_t mode, gid_t gid, bool share_port,
		       metrics_render_fn *render, void *ctx, char *why, size_t why_len)
{
	int r;

	ep.loop = loop;
	ep.render = render;
	ep.ctx = ctx;
	if (strncmp(addr, "unix:", 5) == 0)
		r = listen_unix(addr + 5, mode, gid, why, why_len);
	else
		r = listen_tcp(addr, share_port, why, why_len);
	ep.listening = r == 0;
	return r;
}

void metrics_http_stop(void)
{
	struct http_conn *hc, *next;

	if (!ep.listening)
		return;
	ep.listening = false;
	uv_close(&ep.lsn.handle, NULL);
	if (ep.is_unix)
		server_socket_remove(ep.path);
	for (hc = LIST_FIRST(&ep.list); hc; hc = next) {
		next = LIST_NEXT(hc, link);
		hc_close(hc);
	}
}
