/*
 * Peering: the peer table and the public API of peer.h. The set's start
 * (the secret file, this node's instance, the configured peers, the
 * listener, the dials) and stop; each peer's state as operators see it.
 * The files beside this one hold the rest (peer_int.h): peer_link.c one
 * connection's reading, writing, backpressure, heartbeats and closing;
 * peer_handshake.c the handshake and a connection coming up;
 * peer_dial.c the dials and the listener; peer_dns.c the --peers-dns
 * names.
 */
#include "peer_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <tensord/tensord.h>

#include "daemon/base/log.h"

const char *peer_state_name(enum peer_state s)
{
	switch (s) {
	case PEER_CONNECTING:
		return "connecting";
	case PEER_AUTHENTICATING:
		return "authenticating";
	case PEER_UP:
		return "up";
	case PEER_DOWN:
		return "down";
	case PEER_REFUSED:
		return "refused";
	}
	return "?";
}

static uint64_t wall_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void peer_mark_state(struct peer *p, enum peer_state s)
{
	if (p->state != s)
		p->since_ns = wall_ns();
	p->state = s;
}

void peer_mark_error(struct peer *p, const char *reason)
{
	snprintf(p->error, sizeof(p->error), "%s", reason);
}

/* --- peers ------------------------------------------------------------------- */

struct peer *peer_add(struct peer_set *set, const char *name)
{
	struct peer *p;

	if (set->n_peers == PEER_KNOWN_MAX)
		return NULL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->set = set;
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->state = PEER_DOWN;
	p->since_ns = wall_ns();
	p->backoff_ms = PEER_REDIAL_MIN_MS;
	uv_timer_init(set->loop, &p->redial);
	p->redial.data = p;
	set->peers[set->n_peers++] = p;
	return p;
}

struct peer *peer_lookup(struct peer_set *set, const char *name)
{
	for (unsigned i = 0; i < set->n_peers; i++)
		if (strcmp(set->peers[i]->name, name) == 0)
			return set->peers[i];
	return NULL;
}

/* --- the set ------------------------------------------------------------------- */

/* The secret file into set->secret (and set->also); on failure set is unchanged. */
static int secrets_load(struct peer_set *set, char *why, size_t why_len)
{
	uint8_t buf[PEER_SECRET_MAX];
	const uint8_t *also;
	size_t len, first, also_len;
	int r;

	r = peer_secret_load(set->secret_file, buf, sizeof(buf), &len, why, why_len);
	if (r == 0)
		r = peer_secret_split(set->secret_file, buf, len, &first, &also, &also_len, why,
				      why_len);
	if (r == 0) {
		memcpy(set->secret, buf, first);
		set->secret_len = first;
		explicit_bzero(set->also, sizeof(set->also));
		memcpy(set->also, also ? also : buf, also_len);
		set->also_len = also_len;
	}
	explicit_bzero(buf, sizeof(buf));
	return r;
}

int peer_set_reload_secret(struct peer_set *set, char *why, size_t why_len)
{
	int r;

	if (!set->on)
		return 0;
	r = secrets_load(set, why, why_len);
	if (r == 0)
		log_info("peer secret file %s read again: %s", set->secret_file,
			 set->also_len ? "two secrets (proving with the first, accepting both)"
				       : "one secret");
	return r;
}

int peer_set_start(struct peer_set *set, uv_loop_t *loop, const struct peer_config *cfg, char *why,
		   size_t why_len)
{
	int r;

	LIST_INIT(&set->conns);
	LIST_INIT(&set->failed);
	set->loop = loop;
	uv_check_init(loop, &set->reap);
	set->reap.data = set;
	uv_idle_init(loop, &set->reap_idle);
	set->reap_idle.data = set;
	if (!peer_config_on(cfg)) {
		if (cfg->secret_file)
			log_warn(
				"--peer-secret-file %s: not read, ignoring: peering is off without "
				"--peer-listen, --peer or --peers-dns",
				cfg->secret_file);
		return 0;
	}
	if (!cfg->secret_file) {
		snprintf(why, why_len,
			 "--peer-secret-file is required with --peer-listen, --peer and "
			 "--peers-dns");
		return -EINVAL;
	}
	snprintf(set->secret_file, sizeof(set->secret_file), "%s", cfg->secret_file);
	r = secrets_load(set, why, why_len);
	if (r < 0)
		return r;
	set->on = true;
	snprintf(set->self, sizeof(set->self), "%s", cfg->node_name);
	if (getrandom(&set->instance, sizeof(set->instance), 0) != sizeof(set->instance))
		set->instance = wall_ns() ^ ((uint64_t)getpid() << 32);
	for (unsigned i = 0; i < cfg->n_peers; i++) {
		struct peer *p = peer_add(set, cfg->peers[i].name);

		if (!p) {
			snprintf(why, why_len, "out of memory");
			return -ENOMEM;
		}
		p->configured = true;
		snprintf(p->host, sizeof(p->host), "%s", cfg->peers[i].host);
		p->port = cfg->peers[i].port;
		snprintf(p->addr, sizeof(p->addr), "%s%s%s:%u", strchr(p->host, ':') ? "[" : "",
			 p->host, strchr(p->host, ':') ? "]" : "", p->port);
	}
	return 0;
}

int peer_set_listen(struct peer_set *set, const struct peer_config *cfg, int fd, char *why,
		    size_t why_len)
{
	int r;

	if (!set->on) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	if (cfg->listen) {
		r = peer_listen(set, cfg, fd, why, why_len);
		if (r < 0)
			return r;
	}
	for (unsigned i = 0; i < set->n_peers; i++)
		peer_dial(set->peers[i]);
	peer_dns_start(set, cfg);
	log_info("peering as node %s (instance %016" PRIx64
		 "): %s%s%s, %u peers configured, %u DNS names of peers",
		 set->self, set->instance, cfg->listen ? "listening on " : "not listening",
		 cfg->listen ? cfg->listen : "", fd >= 0 ? " (its predecessor's socket)" : "",
		 cfg->n_peers, cfg->n_dns);
	return 0;
}

void peer_set_let_go(struct peer_set *set)
{
	struct peer_conn *pc;

	if (!set->draining)
		return;
	while ((pc = LIST_FIRST(&set->conns)))
		pc_close(pc, CLOSE_QUIET, "the next daemon of this node serves");
}

int peer_set_listen_fd(const struct peer_set *set)
{
	uv_os_fd_t fd;

	if (!set->listening || uv_fileno((const uv_handle_t *)&set->listener, &fd) < 0)
		return -1;
	return fd;
}

void peer_set_drain(struct peer_set *set)
{
	if (!set->on || set->stopping || set->draining)
		return;
	set->draining = true;
	if (set->listening) {
		uv_close((uv_handle_t *)&set->listener, NULL);
		set->listening = false;
	}
	for (unsigned i = 0; i < set->n_peers; i++)
		uv_timer_stop(&set->peers[i]->redial);
	peer_dns_pause(set);
	log_info("peering: draining: listening no more, dialling no more; %u links up stay",
		 set->n_up);
}

void peer_set_stop(struct peer_set *set)
{
	struct peer_conn *pc;

	if (!set->loop || set->stopping)
		return;
	set->stopping = true;
	if (set->listening)
		uv_close((uv_handle_t *)&set->listener, NULL);
	set->listening = false;
	while ((pc = LIST_FIRST(&set->conns)))
		pc_close(pc, CLOSE_QUIET, "the daemon is stopping");
	uv_check_stop(&set->reap);
	uv_idle_stop(&set->reap_idle);
	uv_close((uv_handle_t *)&set->reap, NULL);
	uv_close((uv_handle_t *)&set->reap_idle, NULL);
	for (unsigned i = 0; i < set->n_peers; i++) {
		struct peer *p = set->peers[i];

		if (p->resolving)
			uv_cancel((uv_req_t *)&p->gai);
		uv_close((uv_handle_t *)&p->redial, NULL);
	}
	peer_dns_stop(set);
}

void peer_set_fini(struct peer_set *set)
{
	for (unsigned i = 0; i < set->n_peers; i++)
		free(set->peers[i]);
	set->n_peers = 0;
	explicit_bzero(set->secret, sizeof(set->secret));
	explicit_bzero(set->also, sizeof(set->also));
	set->secret_len = set->also_len = 0;
}
