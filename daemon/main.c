/*
 * tensord: the daemon. Reads its options (options.c), builds the daemon
 * (server.c: the registry and the layers wired together, see server.h),
 * starts the peers and the listening socket, handles signals, runs the
 * libuv loop until SIGTERM or SIGINT.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tensord/tensord.h>

#include "common/sys.h"
#include "dispatch.h"
#include "daemon/base/log.h"
#include "metrics.h"
#include "metrics_http.h"
#include "options.h"
#include "hold.h"
#include "prometheus.h"
#include "reply.h"
#include "daemon/base/sdnotify.h"
#include "server.h"

/* SIGUSR1: the state, in total, per device and per client, into the log. */
static void log_state(struct server *srv)
{
	uint32_t slabs;
	uint64_t slab_bytes;
	struct conn *c;

	ratelimit_flush_all();
	backend_host_slab_stats(&slabs, &slab_bytes);
	log_info("state: %u clients, %llu tensors (%zu named), %llu leases, %u slabs holding "
		 "%llu bytes",
		 srv->conns.n, (unsigned long long)srv->reg.n_tensors, srv->reg.n_named,
		 (unsigned long long)srv->reg.n_leases, slabs, (unsigned long long)slab_bytes);
	for (int i = 0; i < srv->reg.n_devices; i++) {
		const struct reg_device *d = &srv->reg.devices[i];

		if (d->init_rc == 0)
			log_info("state: %s:%d: %u tensors, %llu of %llu bytes", d->ops->name,
				 d->device.device_id, d->tensors, (unsigned long long)d->used,
				 (unsigned long long)d->capacity);
	}
	LIST_FOREACH(c, &srv->conns.list, link)
	{
		const struct client *cl = conn_data(c);

		log_info("state: conn %llu: pid %u uid %u gid %u: %u leases",
			 (unsigned long long)c->id, c->pid, c->uid, c->gid, cl->rc.n_leases);
	}
	for (unsigned i = 0; i < srv->peers.n_peers; i++) {
		const struct peer *p = srv->peers.peers[i];

		log_info("state: peer %s (%s): %s, %llu connects, %llu failures%s%s", p->name,
			 p->addr, peer_state_name(p->state), (unsigned long long)p->connects,
			 (unsigned long long)p->failures, p->error[0] ? "; last error: " : "",
			 p->error);
	}
}

/*
 * Signals that would kill the daemon by default, and its named tensors
 * with it: SIGHUP reopens --log-file (after a rotation) and reads the
 * peer secret file again (a rotation of the secret: docs/operating.md),
 * SIGUSR1 logs the state, SIGUSR2 drains a daemon under a holder for its
 * successor (server_drain()) and is only a line anywhere else. SIGPIPE is
 * ignored outright (main()).
 */
static void on_other_signal(uv_signal_t *h, int signum)
{
	struct server *srv = h->data;
	char why[400];
	int r;

	if (signum == SIGUSR1) {
		log_state(srv);
		return;
	}
	if (signum == SIGUSR2) {
		server_drain(srv);
		return;
	}
	if ((r = log_reopen()) == 1)
		log_info("received SIGHUP, ignoring: the log is stderr, nothing to reopen");
	else if (r < 0)
		log_error("received SIGHUP: cannot reopen the log file: %s", strerror(-r));
	else
		log_info("received SIGHUP, reopened the log file");
	if (peer_set_reload_secret(&srv->peers, why, sizeof(why)) < 0)
		log_error("received SIGHUP: %s; the secrets in use stay", why);
}

static void on_signal(uv_signal_t *h, int signum)
{
	struct server *srv = h->data;

	log_info("received %s", signum == SIGTERM ? "SIGTERM" : "SIGINT");
	server_stop(srv);
}

/*
 * A test hook: with $TENSORD_TEST_READY_GATE naming a FIFO, the daemon
 * has restored and listens but serves nobody and says nothing to its
 * service manager until a byte is written to it (tests/python/
 * test_upgrade.py holds an upgrade between the old daemon's drain and the
 * new one's READY=1 this way, without a timing).
 */
static void test_ready_gate(void)
{
	const char *path = getenv("TENSORD_TEST_READY_GATE");
	char b;
	int fd;

	if (!path || !*path)
		return;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || read(fd, &b, 1) != 1)
		log_warn("TENSORD_TEST_READY_GATE %s: %s, going on", path,
			 fd < 0 ? strerror(errno) : "closed");
	if (fd >= 0)
		close(fd);
}

/* Clients each hold a descriptor; use every one the hard limit allows. */
static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* The metrics endpoint's text: the daemon's state and counters. */
static int render_metrics(void *ctx, char **ret, size_t *ret_len)
{
	return prometheus_render(ctx, ret, ret_len);
}

/* This network namespace's identity (its inode), 0 when /proc does not say. */
static unsigned long long netns_id(void)
{
	struct stat sb;

	return stat("/proc/self/ns/net", &sb) == 0 ? (unsigned long long)sb.st_ino : 0;
}

/*
 * --peer-listen: on the socket a predecessor kept in the descriptor store
 * when it is bound where this daemon listens and in this network namespace
 * (a pod that replaces another has a namespace of its own, and the old
 * socket's address goes with the old pod), else on one bound now and
 * stored for the next daemon: the port never closes across a restart or
 * an upgrade, and peers dialling meanwhile wait in its backlog. A stored
 * socket not listened on again leaves the store. 0, or -errno with why.
 */
static int peers_listen(struct server *srv, char *why, size_t why_len)
{
	char name[256], mine[64];
	int fd, use = -1, r;

	snprintf(mine, sizeof(mine), "%s.%llu", STATE_PEER_LISTEN_PREFIX, netns_id());
	while ((fd = sdnotify_take_named(STATE_PEER_LISTEN_PREFIX, name, sizeof(name))) >= 0) {
		bool here = strcmp(name, mine) == 0;

		if (use < 0 && here && peer_listen_matches(&srv->cfg.peer, fd)) {
			use = fd;
			continue;
		}
		log_info("%s: a stored listening socket for peers, %s: closing it and removing it "
			 "from the store",
			 name,
			 !here                   ? "of another network namespace"
			 : !srv->cfg.peer.listen ? "and this daemon has no --peer-listen"
						 : "bound elsewhere than --peer-listen");
		close(fd);
		state_unstore_socket(srv->state, name);
	}
	r = peer_set_listen(&srv->peers, &srv->cfg.peer, use, why, why_len);
	if (r == 0 && use < 0 && srv->state && (fd = peer_set_listen_fd(&srv->peers)) >= 0)
		state_store_socket(srv->state, fd, mine);
	return r;
}

/*
 * A start that fails once the store is taken: what it restored stays in
 * the store, as after a SIGTERM, for the next daemon. Returns main's 1.
 */
static int fail_started(struct server *srv)
{
	server_unlisten(srv);
	state_freeze(srv->state);
	registry_fini(&srv->reg);
	quota_fini(&srv->quota);
	return 1;
}

int main(int argc, char **argv)
{
	static struct server srv;
	int ready_fd = -1, r;

	log_init();
	if (argc == 3 && strcmp(argv[1], "--hold") == 0)
		return hold_main(argv[2]);
	sdnotify_init();
	r = options_parse(argc, argv, &srv.cfg, &ready_fd);
	if (r >= 0)
		return r;
	signal(SIGPIPE, SIG_IGN);
	raise_fd_limit();
	r = server_init(&srv);
	if (r < 0) {
		log_error("registry: %s", strerror(-r));
		return 1;
	}
	/* Before the store is taken: a bad secret file is refused with nothing made. */
	{
		char why[600];

		r = peer_set_start(&srv.peers, srv.loop, &srv.cfg.peer, why, sizeof(why));
		if (r < 0) {
			fprintf(stderr, "tensord: %s\n", why);
			sdnotify("STATUS=%s\nERRNO=%d", why, -r);
			return 1;
		}
		/* Before any peer is up: it hooks into srv.peers (remote.c). */
		remote_start(&srv.remote);
	}
	/* Before the socket: what a predecessor published serves from the first request. */
	{
		char why[400];
		const char *env = getenv("FDSTORE");
		uint64_t max = srv.cfg.fdstore_set ? srv.cfg.fdstore_max
			       : srv.cfg.holder[0] ? 65536
			       : env && *env       ? strtoull(env, NULL, 10)
						   : 0;

		r = srv.cfg.holder[0] ? sdnotify_use_holder(srv.cfg.holder, why, sizeof(why)) : 0;
		if (r < 0) {
			fprintf(stderr, "tensord: %s\n", why);
			return 1;
		}
		srv.seqs = seqs_new(0);
		if (!srv.seqs) {
			fprintf(stderr, "tensord: out of memory\n");
			return 1;
		}
		r = state_start(&srv.state, &srv.reg, max, srv.cfg.state_log_size, srv.seqs, why,
				sizeof(why));
		if (r < 0) {
			fprintf(stderr, "tensord: %s\n", why);
			sdnotify("STATUS=%s\nERRNO=%d", why, -r);
			return 1;
		}
		if (srv.state)
			reply_set_lineage(state_lineage(srv.state));
		srv.state_figures = state_figures_live(srv.state);
		server_readopt_start(&srv);
	}
	/* Before the clients' socket: sdnotify_listen_fd() takes any socket left. */
	{
		char why[600];

		r = peers_listen(&srv, why, sizeof(why));
		if (r < 0) {
			fprintf(stderr, "tensord: %s\n", why);
			sdnotify("STATUS=%s\nERRNO=%d", why, -r);
			return fail_started(&srv);
		}
	}
	r = server_listen(&srv);
	sdnotify_passed_end();
	/* A socket the daemon bound itself is stored too: clients of the next
	 * daemon connect to it, and wait in its backlog meanwhile. */
	if (r == 0 && srv.state && !srv.socket_inherited)
		srv.socket_stored =
			state_store_socket(srv.state, srv.listen_fd, STATE_LISTEN_NAME) == 0;
	if (r < 0) {
		fprintf(stderr, "tensord: cannot listen on %s: %s\n", srv.cfg.socket_path,
			r == -EADDRINUSE ? "another tensord is running there"
			: r == -EPERM    ? "its directory is not safe to use (see above)"
					 : strerror(-r));
		sdnotify("STATUS=cannot listen on %s: %s\nERRNO=%d", srv.cfg.socket_path,
			 strerror(-r), -r);
		return fail_started(&srv);
	}
	if (srv.cfg.metrics_addr) {
		char why[300];

		/* Under a holder the next daemon binds a TCP port while this one
		 * drains (restart.md section 6): shared, as the kernel allows
		 * only the same uid. */
		r = metrics_http_start(srv.loop, srv.cfg.metrics_addr, srv.cfg.socket_mode,
				       srv.cfg.socket_gid, srv.cfg.holder[0] != '\0',
				       render_metrics, &srv, why, sizeof(why));
		if (r < 0) {
			fprintf(stderr, "tensord: --metrics %s\n", why);
			return fail_started(&srv);
		}
	}
	uv_signal_init(srv.loop, &srv.sigterm);
	uv_signal_init(srv.loop, &srv.sigint);
	srv.sigterm.data = srv.sigint.data = &srv;
	uv_signal_start(&srv.sigterm, on_signal, SIGTERM);
	uv_signal_start(&srv.sigint, on_signal, SIGINT);
	uv_signal_init(srv.loop, &srv.sighup);
	uv_signal_init(srv.loop, &srv.sigusr1);
	uv_signal_init(srv.loop, &srv.sigusr2);
	srv.sighup.data = srv.sigusr1.data = srv.sigusr2.data = &srv;
	uv_signal_start(&srv.sighup, on_other_signal, SIGHUP);
	uv_signal_start(&srv.sigusr1, on_other_signal, SIGUSR1);
	uv_signal_start(&srv.sigusr2, on_other_signal, SIGUSR2);
	test_ready_gate();
	/* READY=1 first: whoever waits on --ready-fd may then count on the
	 * service manager (a holder: that the daemon drains when asked). */
	sdnotify("READY=1\nSTATUS=listening on %s", srv.cfg.socket_path);
	if (ready_fd >= 0) {
		if (write(ready_fd, "R", 1) != 1)
			log_warn("--ready-fd %d: %s, ignoring", ready_fd, strerror(errno));
		close(ready_fd);
	}

	uv_run(srv.loop, UV_RUN_DEFAULT);

	server_fini(&srv);
	state_stop(srv.state);
	seqs_free(srv.seqs);
	peer_set_fini(&srv.peers);
	uv_loop_close(srv.loop);
	log_info("stopped");
	free((char *)srv.cfg.metrics_addr);
	free(srv.cfg.peer.listen);
	free(srv.cfg.peer.secret_file);
	return 0;
}
