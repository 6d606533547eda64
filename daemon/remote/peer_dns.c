/*
 * Peering: --peers-dns HOST[:PORT] (peer.h, struct peer_dns and struct
 * peer_target). Each name is resolved every PEER_DNS_INTERVAL_MS on
 * libuv's thread pool; every address of its last good answer is a target,
 * dialled (by peer_dial.c) until the node there authenticates, and again
 * whenever that node is down. A failed resolution is logged (rate-limited)
 * and keeps the last good answer's addresses. An address found to be this
 * daemon itself (peer_handshake.c's self_dial_found()) is never dialled
 * again. Their state goes out in PeerListReply.dns (inspect.c).
 */
#include "peer_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tensord/tensord.h>

#include "daemon/base/log.h"
#include "daemon/base/ratelimit.h"

/* --- --peers-dns: names resolved to the peers' addresses ------------------------ */

/* Dials t, unless it is this daemon, being dialled, or its node is up. */
static void target_dial(struct peer_target *t)
{
	struct peer_set *set = t->dns->set;

	if (peer_set_quiet(set) || t->self || t->dial || (t->peer && t->peer->up))
		return;
	if (peer_conn_dial_target(t) < 0)
		peer_target_redial_later(t);
}

static void on_target_redial(uv_timer_t *h)
{
	target_dial(h->data);
}

/* t is dialled again after its back-off, which then doubles (as a --peer's). */
void peer_target_redial_later(struct peer_target *t)
{
	struct peer_set *set = t->dns->set;

	if (peer_set_quiet(set) || t->self || t->dial || (t->peer && t->peer->up))
		return;
	uv_timer_start(&t->redial, on_target_redial, t->backoff_ms, 0);
	t->backoff_ms =
		t->backoff_ms >= PEER_REDIAL_MAX_MS / 2 ? PEER_REDIAL_MAX_MS : t->backoff_ms * 2;
}

static void target_free(uv_handle_t *h)
{
	free(h->data);
}

static struct peer_target *target_find(struct peer_set *set, const struct peer_dns *d,
				       const char *addr)
{
	for (unsigned i = 0; i < set->n_targets; i++)
		if (set->targets[i]->dns == d && strcmp(set->targets[i]->addr, addr) == 0)
			return set->targets[i];
	return NULL;
}

static struct peer_target *target_add(struct peer_dns *d, const struct addrinfo *a,
				      const char *addr)
{
	struct peer_set *set = d->set;
	struct peer_target *t;

	if (set->n_targets == PEER_TARGET_MAX) {
		log_limited(TD_LOG_WARN, LOG_KIND_PEER_REFUSED, NULL, NULL,
			    "--peers-dns %s: %s not dialled: %d addresses are known already",
			    d->host, addr, PEER_TARGET_MAX);
		return NULL;
	}
	t = calloc(1, sizeof(*t));
	if (!t) {
		log_warn("--peers-dns %s: %s not dialled: out of memory", d->host, addr);
		return NULL;
	}
	t->dns = d;
	memcpy(&t->sa, a->ai_addr, a->ai_addrlen);
	snprintf(t->addr, sizeof(t->addr), "%s", addr);
	t->backoff_ms = PEER_REDIAL_MIN_MS;
	uv_timer_init(set->loop, &t->redial);
	t->redial.data = t;
	set->targets[set->n_targets++] = t;
	log_info("--peers-dns %s: %s found", d->host, addr);
	return t;
}

/*
 * The i-th target left its name's answer. It is not dialled again; a
 * connection up to its node stays (a DNS hiccup must not cut a working
 * peer), and that peer, once down, is not dialled again unless it comes
 * back in an answer. A dial in progress goes on, on its own.
 */
static void target_drop(struct peer_set *set, unsigned i)
{
	struct peer_target *t = set->targets[i];
	struct peer *p = t->peer;

	log_info("--peers-dns %s: %s left its answer%s%s%s", t->dns->host, t->addr,
		 p ? "; peer " : "", p ? p->name : "",
		 !p      ? ""
		 : p->up ? " stays up until its connection ends"
			 : " is not dialled again");
	if (p && !p->up && !p->configured)
		snprintf(p->error, sizeof(p->error),
			 "not dialled: %.60s left the answer of --peers-dns %.200s", t->addr,
			 t->dns->host);
	if (t->dial)
		peer_conn_forget_target(t->dial);
	memmove(&set->targets[i], &set->targets[i + 1],
		(set->n_targets - i - 1) * sizeof(set->targets[0]));
	set->n_targets--;
	uv_close((uv_handle_t *)&t->redial, target_free);
}

/* A good answer: new addresses are dialled, those gone are dropped. */
static void dns_apply(struct peer_dns *d, const struct addrinfo *ai)
{
	struct peer_set *set = d->set;
	char addr[PEER_ADDR_MAX];
	unsigned n = 0;

	for (unsigned i = 0; i < set->n_targets; i++)
		set->targets[i]->seen = false;
	for (const struct addrinfo *a = ai; a; a = a->ai_next) {
		struct peer_target *t;

		if ((a->ai_family != AF_INET && a->ai_family != AF_INET6) ||
		    a->ai_addrlen > sizeof(t->sa))
			continue;
		peer_sockaddr_text_plain(a->ai_addr, addr, sizeof(addr));
		t = target_find(set, d, addr);
		if (!t) {
			t = target_add(d, a, addr);
			if (t)
				target_dial(t);
		}
		if (t && !t->seen) {
			t->seen = true;
			n++;
		}
	}
	d->n_addrs = n;
	for (unsigned i = set->n_targets; i-- > 0;)
		if (set->targets[i]->dns == d && !set->targets[i]->seen)
			target_drop(set, i);
}

/* A failed resolution keeps the addresses of the last good one (a hiccup is no departure). */
static void dns_failed(struct peer_dns *d, int status)
{
	d->failures++;
	snprintf(d->error, sizeof(d->error), "cannot resolve %.200s: %s", d->host,
		 uv_strerror(status));
	log_limited(TD_LOG_WARN, LOG_KIND_PEER_REFUSED, NULL, NULL,
		    "--peers-dns %s:%u: %s (%s); asked again in %d s, the last answer's %u "
		    "addresses kept",
		    d->host, d->port, d->error, uv_err_name(status), PEER_DNS_INTERVAL_MS / 1000,
		    d->n_addrs);
}

static void on_dns_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *ai)
{
	struct peer_dns *d = req->data;

	d->resolving = false;
	if (peer_set_quiet(d->set) || status == UV_ECANCELED) {
		uv_freeaddrinfo(ai);
		return;
	}
	d->resolutions++;
	if (status < 0 || !ai) {
		dns_failed(d, status < 0 ? status : UV_EAI_NODATA);
		uv_freeaddrinfo(ai);
		return;
	}
	if (d->error[0])
		log_info("--peers-dns %s: resolves again", d->host);
	d->error[0] = '\0';
	dns_apply(d, ai);
	uv_freeaddrinfo(ai);
}

/* Every PEER_DNS_INTERVAL_MS: d's name asked again, on libuv's thread pool (never the loop). */
static void on_dns_timer(uv_timer_t *h)
{
	struct peer_dns *d = h->data;
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
	char port[8];
	int r;

	if (d->resolving || peer_set_quiet(d->set))
		return;
	snprintf(port, sizeof(port), "%u", d->port);
	d->gai.data = d;
	r = uv_getaddrinfo(d->set->loop, &d->gai, on_dns_resolved, d->host, port, &hints);
	if (r < 0) {
		dns_failed(d, r);
		return;
	}
	d->resolving = true;
}

void peer_dns_start(struct peer_set *set, const struct peer_config *cfg)
{
	for (unsigned i = 0; i < cfg->n_dns; i++) {
		struct peer_dns *d = &set->dns[i];

		d->set = set;
		snprintf(d->host, sizeof(d->host), "%s", cfg->dns[i].host);
		d->port = cfg->dns[i].port;
		uv_timer_init(set->loop, &d->timer);
		d->timer.data = d;
		uv_timer_start(&d->timer, on_dns_timer, 0, PEER_DNS_INTERVAL_MS);
		set->n_dns++;
	}
}

void peer_dns_stop(struct peer_set *set)
{
	for (unsigned i = 0; i < set->n_dns; i++) {
		if (set->dns[i].resolving)
			uv_cancel((uv_req_t *)&set->dns[i].gai);
		uv_close((uv_handle_t *)&set->dns[i].timer, NULL);
	}
	for (unsigned i = 0; i < set->n_targets; i++)
		uv_close((uv_handle_t *)&set->targets[i]->redial, target_free);
	set->n_targets = 0;
}

void peer_dns_pause(struct peer_set *set)
{
	for (unsigned i = 0; i < set->n_dns; i++)
		uv_timer_stop(&set->dns[i].timer);
	for (unsigned i = 0; i < set->n_targets; i++)
		uv_timer_stop(&set->targets[i]->redial);
}

/* Each --peers-dns address that led to p is dialled again (p went down). */
void peer_targets_redial(struct peer *p)
{
	for (unsigned i = 0; i < p->set->n_targets; i++)
		if (p->set->targets[i]->peer == p)
			peer_target_redial_later(p->set->targets[i]);
}
