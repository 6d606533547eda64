/*
 * Peering: making connections. Each configured peer (--peer
 * NAME=HOST[:PORT]) is dialled, its name resolved again at each dial, and
 * dialled again after a back-off of 1 s doubling to 30 s while it is not
 * up; --peers-dns addresses are dialled here for peer_dns.c; the listener
 * (--peer-listen) accepts the other nodes' dials, at most PEER_UNAUTH_MAX
 * of them authenticating at once. A connection made goes on to its
 * handshake (peer_handshake.c).
 */
#include "peer_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tensord/tensord.h>

#include "daemon/base/log.h"
#include "daemon/base/ratelimit.h"

static void on_redial(uv_timer_t *t);

void peer_redial_later(struct peer *p)
{
	if (!p->configured || peer_set_quiet(p->set) || p->up || p->dial || p->resolving)
		return;
	uv_timer_start(&p->redial, on_redial, p->backoff_ms, 0);
	p->backoff_ms =
		p->backoff_ms >= PEER_REDIAL_MAX_MS / 2 ? PEER_REDIAL_MAX_MS : p->backoff_ms * 2;
}

static void sockaddr_text(const struct sockaddr *sa, char *out, size_t len)
{
	char ip[INET6_ADDRSTRLEN] = "?";

	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;

		uv_ip6_name(s6, ip, sizeof(ip));
		snprintf(out, len, "[%s]:%u", ip, ntohs(s6->sin6_port));
	} else if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;

		uv_ip4_name(s4, ip, sizeof(ip));
		snprintf(out, len, "%s:%u", ip, ntohs(s4->sin_port));
	} else {
		snprintf(out, len, "?");
	}
}

void peer_sockaddr_text_plain(const struct sockaddr *sa, char *out, size_t len)
{
	const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
	struct sockaddr_in s4 = { .sin_family = AF_INET };

	if (sa->sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
		s4.sin_port = s6->sin6_port;
		memcpy(&s4.sin_addr, &s6->sin6_addr.s6_addr[12], 4);
		sa = (const struct sockaddr *)&s4;
	}
	sockaddr_text(sa, out, len);
}

static void on_connected(uv_connect_t *req, int status)
{
	struct peer_conn *pc = req->data;

	if (pc->closing)
		return;
	assert(pc->dialler && pc->phase == PC_CONNECTING);
	if (status < 0) {
		pc_close(pc, CLOSE_LOST, "cannot connect to %s: %s", pc->addr, uv_strerror(status));
		return;
	}
	pc_handshake_start(pc);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *ai)
{
	struct peer *p = req->data;
	struct peer_set *set = p->set;
	struct peer_conn *pc;
	int r;

	p->resolving = false;
	if (peer_set_quiet(set) || p->up) {
		uv_freeaddrinfo(ai);
		return;
	}
	if (status < 0 || !ai) {
		p->failures++;
		peer_mark_state(p, PEER_DOWN);
		snprintf(p->error, sizeof(p->error), "cannot resolve %.200s: %s", p->host,
			 uv_strerror(status));
		log_limited(TD_LOG_WARN, LOG_KIND_PEER_REFUSED, NULL, NULL, "peer %s: %s", p->name,
			    p->error);
		uv_freeaddrinfo(ai);
		peer_redial_later(p);
		return;
	}
	pc = pc_new(set, true);
	if (!pc) {
		uv_freeaddrinfo(ai);
		peer_mark_error(p, "out of memory");
		peer_redial_later(p);
		return;
	}
	assert(!p->dial);
	pc->peer = p;
	p->dial = pc;
	sockaddr_text(ai->ai_addr, pc->addr, sizeof(pc->addr));
	pc->connect_req.data = pc;
	r = uv_tcp_connect(&pc->connect_req, &pc->tcp, ai->ai_addr, on_connected);
	uv_freeaddrinfo(ai);
	if (r < 0)
		pc_close(pc, CLOSE_LOST, "cannot connect to %s: %s", pc->addr, uv_strerror(r));
}

void peer_dial(struct peer *p)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	char port[8];
	int r;

	if (peer_set_quiet(p->set) || p->up || p->dial || p->resolving)
		return;
	peer_mark_state(p, PEER_CONNECTING);
	snprintf(port, sizeof(port), "%u", p->port);
	p->gai.data = p;
	/* Resolved again at each dial: a peer's DNS name may move. */
	r = uv_getaddrinfo(p->set->loop, &p->gai, on_resolved, p->host, port, &hints);
	if (r < 0) {
		peer_mark_state(p, PEER_DOWN);
		snprintf(p->error, sizeof(p->error), "cannot resolve %.200s: %s", p->host,
			 uv_strerror(r));
		peer_redial_later(p);
		return;
	}
	p->resolving = true;
}

static void on_redial(uv_timer_t *t)
{
	peer_dial(t->data);
}

int peer_conn_dial_target(struct peer_target *t)
{
	struct peer_conn *pc = pc_new(t->dns->set, true);
	int r;

	if (!pc)
		return -ENOMEM;
	assert(!t->dial && !t->self);
	pc->target = t;
	t->dial = pc;
	snprintf(pc->addr, sizeof(pc->addr), "%s", t->addr);
	pc->connect_req.data = pc;
	r = uv_tcp_connect(&pc->connect_req, &pc->tcp, (const struct sockaddr *)&t->sa,
			   on_connected);
	if (r < 0)
		pc_close(pc, CLOSE_LOST, "cannot connect to %s: %s", pc->addr, uv_strerror(r));
	return 0;
}

void peer_conn_forget_target(struct peer_conn *pc)
{
	assert(pc->target && pc->target->dial == pc && pc->phase != PC_UP);
	pc->target = NULL;
}

static void on_connection(uv_stream_t *server, int status)
{
	struct peer_set *set = server->data;
	struct sockaddr_storage ss;
	int len = sizeof(ss);
	struct peer_conn *pc;

	if (status < 0 || peer_set_quiet(set))
		return;
	pc = pc_new(set, false);
	if (!pc) {
		uv_tcp_t *t = malloc(sizeof(*t));

		/* Take it off the backlog and close it, or the loop spins on it. */
		if (t && uv_tcp_init(set->loop, t) == 0) {
			if (uv_accept(server, (uv_stream_t *)t) == 0)
				log_warn("peer connection refused: out of memory");
			uv_close((uv_handle_t *)t, (uv_close_cb)free);
		} else {
			free(t);
		}
		return;
	}
	if (uv_accept(server, (uv_stream_t *)&pc->tcp) < 0) {
		pc_close(pc, CLOSE_QUIET, "accept failed");
		return;
	}
	if (uv_tcp_getpeername(&pc->tcp, (struct sockaddr *)&ss, &len) == 0)
		sockaddr_text((struct sockaddr *)&ss, pc->addr, sizeof(pc->addr));
	else
		snprintf(pc->addr, sizeof(pc->addr), "?");
	if (set->n_unauth > PEER_UNAUTH_MAX) {
		pc_close(pc, CLOSE_REFUSED, "%d connections are authenticating already",
			 PEER_UNAUTH_MAX);
		return;
	}
	pc_handshake_start(pc);
}

/* Where cfg's --peer-listen is, as a socket address; -EINVAL when it is not an IP address. */
static int listen_addr(const struct peer_config *cfg, struct sockaddr_storage *ss)
{
	const char *host = cfg->listen_host;

	memset(ss, 0, sizeof(*ss));
	if (!host[0])
		return uv_ip6_addr("::", cfg->listen_port, (struct sockaddr_in6 *)ss);
	if (strchr(host, ':'))
		return uv_ip6_addr(host, cfg->listen_port, (struct sockaddr_in6 *)ss);
	return uv_ip4_addr(host, cfg->listen_port, (struct sockaddr_in *)ss);
}

bool peer_listen_matches(const struct peer_config *cfg, int fd)
{
	struct sockaddr_storage want, got;
	socklen_t len = sizeof(got), olen = sizeof(int);
	int type = 0, listening = 0;

	if (!cfg->listen || listen_addr(cfg, &want) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &olen) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &olen) < 0 ||
	    type != SOCK_STREAM || !listening ||
	    getsockname(fd, (struct sockaddr *)&got, &len) < 0 || got.ss_family != want.ss_family)
		return false;
	if (want.ss_family == AF_INET) {
		const struct sockaddr_in *w = (const void *)&want, *g = (const void *)&got;

		return w->sin_addr.s_addr == g->sin_addr.s_addr &&
		       (!w->sin_port || w->sin_port == g->sin_port);
	}
	{
		const struct sockaddr_in6 *w = (const void *)&want, *g = (const void *)&got;

		return memcmp(&w->sin6_addr, &g->sin6_addr, sizeof(w->sin6_addr)) == 0 &&
		       (!w->sin6_port || w->sin6_port == g->sin6_port);
	}
}

int peer_listen(struct peer_set *set, const struct peer_config *cfg, int fd, char *why,
		size_t why_len)
{
	struct sockaddr_storage ss;
	int r = listen_addr(cfg, &ss);

	if (r < 0) {
		snprintf(why, why_len, "--peer-listen %s: '%s' is not an IP address", cfg->listen,
			 cfg->listen_host);
		if (fd >= 0)
			close(fd);
		return -EINVAL;
	}
	uv_tcp_init(set->loop, &set->listener);
	set->listener.data = set;
	set->listening = true;
	if (fd >= 0) {
		/* Listening already: connections made meanwhile wait in its backlog. */
		r = uv_tcp_open(&set->listener, fd);
		if (r < 0)
			close(fd);
	} else {
		r = uv_tcp_bind(&set->listener, (struct sockaddr *)&ss, 0);
	}
	if (r == 0)
		r = uv_listen((uv_stream_t *)&set->listener, 64, on_connection);
	if (r < 0) {
		snprintf(why, why_len, "--peer-listen %s: cannot listen: %s", cfg->listen,
			 uv_strerror(r));
		return r;
	}
	snprintf(set->listen_addr, sizeof(set->listen_addr), "%s", cfg->listen);
	return 0;
}
