/*
 * tensord: the daemon. Reads its options (options.c), sets up the registry
 * and the listening socket, wires the layers together (see server.h), runs
 * the libuv loop until SIGTERM or SIGINT.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <tensord/tensord.h>

#include "common/sys.h"
#include "dispatch.h"
#include "daemon/memory/gpu_worker.h"
#include "daemon/base/log.h"
#include "metrics.h"
#include "metrics_http.h"
#include "options.h"
#include "prometheus.h"
#include "sdnotify.h"
#include "reply.h"
#include "server.h"

/* Stops accepting, closes every client, frees everything; the loop then ends.
 */
static void server_stop(struct server *srv)
{
	if (srv->stopping)
		return;
	srv->stopping = true;
	log_info("stopping: %u clients, %llu tensors", srv->conns.n,
		 (unsigned long long)srv->reg.n_tensors);
	sdnotify("STOPPING=1\nSTATUS=stopping: %u clients, %llu tensors", srv->conns.n,
		 (unsigned long long)srv->reg.n_tensors);
	server_unlisten(srv);
	remote_stop(srv);
	peer_set_stop(&srv->peers);
	metrics_http_stop();
	ratelimit_flush_all();
	waiters_drop_all(&srv->waiters);
	conn_close_all(&srv->conns);
	conn_set_fini(&srv->conns);
	/* The daemon's exit frees its GPU memory anyway: nothing waits for clients. */
	quarantine_fini(&srv->quarantine);
	uv_close((uv_handle_t *)&srv->sigterm, NULL);
	uv_close((uv_handle_t *)&srv->sigint, NULL);
	uv_close((uv_handle_t *)&srv->sighup, NULL);
	uv_close((uv_handle_t *)&srv->sigusr1, NULL);
	uv_close((uv_handle_t *)&srv->sigusr2, NULL);
	uv_close((uv_handle_t *)&srv->spin_idle, NULL);
	uv_close((uv_handle_t *)&srv->bind_due, NULL);
	uv_close((uv_handle_t *)&srv->bind_wake, NULL);
	/* Creates still allocating complete after the loop (main()). */
	gpu_worker_set_notify(NULL, NULL);
	uv_close((uv_handle_t *)&srv->gpu_done, NULL);
}

/* The GPU worker's hook (gpu_worker.h), on its thread: wake the loop. */
static void gpu_notify(void *ctx)
{
	uv_async_send(ctx);
}

static void on_gpu_done(uv_async_t *h)
{
	gpu_worker_complete();
}

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
 * SIGUSR1 logs the state, SIGUSR2 only a line. SIGPIPE is ignored
 * outright (main()).
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
		log_info("received SIGUSR2, ignoring");
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

/* Clients each hold a descriptor; use every one the hard limit allows. */
static void raise_fd_limit(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/*
 * Polling after a request. Waking a sleeping process on another CPU costs
 * tens of microseconds on a VM, more than serving an attach; a client that
 * sends its next request within the spin budget of the last one finds the
 * loop awake. srv->spin decides the budget (0 while the loop's thread is
 * confined to one CPU, or backing off: common/sys.h) and learns how each
 * poll ended: a request came (a hit), the budget ran out (a miss), or a
 * gap between two iterations of the loop shows that the thread lost its
 * CPU meanwhile. Iterations that serve a frame re-arm the poll and take
 * their time from there, so only polling counts in the gaps.
 */
static void on_spin(uv_idle_t *h)
{
	struct server *srv = h->data;
	uint64_t now = now_ns();

	if (now - srv->spin_seen > TD_SPIN_LOST_NS || now >= srv->spin_until) {
		td_spin_record(&srv->spin,
			       now - srv->spin_seen > TD_SPIN_LOST_NS ? TD_SPIN_LOST : TD_SPIN_MISS,
			       now);
		uv_idle_stop(h);
		return;
	}
	srv->spin_seen = now;
	srv->spin_polled = true;
}

void server_spin_seen(struct server *srv)
{
	uint64_t now;

	/* A frame read in a later iteration than the one that armed the
	 * poll came while the loop polled. */
	if (uv_is_active((uv_handle_t *)&srv->spin_idle) && srv->spin_polled) {
		now = now_ns();
		td_spin_record(&srv->spin,
			       now - srv->spin_seen > TD_SPIN_LOST_NS ? TD_SPIN_LOST : TD_SPIN_HIT,
			       now);
	}
}

void server_spin_arm(struct server *srv)
{
	bool spinning = uv_is_active((uv_handle_t *)&srv->spin_idle);
	uint64_t now;
	unsigned us;

	if (srv->stopping)
		return;
	now = now_ns();
	us = td_spin_budget_us(&srv->spin, now);
	if (us == 0) {
		if (spinning)
			uv_idle_stop(&srv->spin_idle);
		return;
	}
	srv->spin_until = now + (uint64_t)us * 1000;
	srv->spin_seen = now;
	srv->spin_polled = false;
	if (!spinning)
		uv_idle_start(&srv->spin_idle, on_spin);
}

/*
 * The client threads waiting on binding pages cleared meanwhile wake
 * (registry_bind.c) a millisecond after the first clear: off the path of
 * the replies and watch events of the commit that cleared them, and of the
 * processes those woke (the kernel may have queued one on this CPU, behind
 * whatever the loop does before it sleeps). Checked before each poll.
 */
#define BIND_WAKE_MS 1

static void on_bind_wake(uv_timer_t *h)
{
	(void)h;
	registry_bind_wake();
}

static void on_bind_due(uv_prepare_t *h)
{
	struct server *srv = h->data;

	if (registry_bind_due() && !uv_is_active((uv_handle_t *)&srv->bind_wake))
		uv_timer_start(&srv->bind_wake, on_bind_wake, BIND_WAKE_MS, 0);
}

static void on_frame(struct conn *c, const uint8_t *payload, size_t len, void *ctx)
{
	struct server *srv = ctx;

	server_spin_seen(srv);
	dispatch_frame(c, payload, len, ctx);
	server_spin_arm(srv);
}

/* The metrics endpoint's text: the daemon's state and counters. */
static int render_metrics(void *ctx, char **ret, size_t *ret_len)
{
	return prometheus_render(ctx, ret, ret_len);
}

/* How each layer reaches the one above it. */
static const struct conn_handlers conn_handlers = {
	.on_open = dispatch_open,
	.on_frame = on_frame,
	.on_protocol_error = dispatch_protocol_error,
	.on_close = dispatch_close,
	.on_drained = dispatch_drained,
	.export_fd = dispatch_export_fd,
	.export_failed = dispatch_export_failed,
	.pack_refusal = reply_pack_refusal,
};

/* The per-uid shares, with defaults from the descriptor budget. */
static void quota_setup(struct server *srv)
{
	struct quota_limits lim = srv->cfg.limits;
	struct rlimit rl;
	unsigned budget = 1024;
	char shares[1024];

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		budget = rl.rlim_cur > 1u << 30 ? 1u << 30 : (unsigned)rl.rlim_cur;
	quota_default_limits(&lim, budget, srv->cfg.max_clients);
	quota_init(&srv->quota, &lim);
	quota_describe(&lim, shares, sizeof(shares));
	log_info(
		"shares per uid: %s; per connection %u waiters, %u descriptors in flight; %u of %u "
		"descriptors kept for root",
		shares, lim.waiters_per_conn, lim.fds_in_flight_per_conn, lim.fd_reserve,
		lim.fd_budget);
}

/* Everything but the listening socket. 0 or -errno. */
static int server_init(struct server *srv)
{
	int r;

	quota_setup(srv);
	srv->loop = uv_default_loop();
	srv->start_ns = now_ns();
	srv->listen_fd = -1;
	srv->reserve_fd = -1;
	r = registry_init(&srv->reg, srv->cfg.host_capacity);
	if (r < 0)
		return r;
	reply_on_status = metrics_reply_status;
	metrics_keep_figures(&srv->reg);
	srv->reg.quota = &srv->quota;
	srv->reg.show_all_metadata = srv->cfg.show_all_metadata;
	conn_set_init(&srv->conns, srv->loop, &conn_handlers, srv, sizeof(struct client),
		      srv->cfg.max_clients);
	srv->conns.quota = &srv->quota;
	srv->conns.fds_per_conn = srv->quota.lim.fds_in_flight_per_conn;
	waiters_init(&srv->waiters, srv->loop, dispatch_waiter_done, srv);
	quarantine_init(&srv->quarantine, srv->loop, &srv->reg, &srv->quota);
	srv->waiters.set_ready = dispatch_set_ready;
	srv->reg.on_commit = dispatch_on_commit;
	srv->reg.on_commit_ctx = srv;
	uv_idle_init(srv->loop, &srv->spin_idle);
	srv->spin_idle.data = srv;
	td_spin_init(&srv->spin);
	uv_prepare_init(srv->loop, &srv->bind_due);
	srv->bind_due.data = srv;
	uv_prepare_start(&srv->bind_due, on_bind_due);
	uv_unref((uv_handle_t *)&srv->bind_due); /* it keeps no loop running */
	uv_timer_init(srv->loop, &srv->bind_wake);
	uv_async_init(srv->loop, &srv->gpu_done, on_gpu_done);
	gpu_worker_set_notify(gpu_notify, &srv->gpu_done);
	return 0;
}

/*
 * After the loop: let the GPU worker finish what it was doing and complete
 * those creates (their clients are gone, so the memory is released), then
 * free every tensor.
 */
static void server_fini(struct server *srv)
{
	gpu_worker_set_notify(NULL, NULL);
	gpu_worker_drain();
	gpu_worker_complete();
	registry_fini(&srv->reg);
	quota_fini(&srv->quota);
}

int main(int argc, char **argv)
{
	static struct server srv;
	int ready_fd = -1, r;

	log_init();
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
	/* Before the socket: a bad secret file or peer port is refused with nothing made. */
	{
		char why[600];

		r = peer_set_start(&srv.peers, srv.loop, &srv.cfg.peer, why, sizeof(why));
		if (r < 0) {
			fprintf(stderr, "tensord: %s\n", why);
			sdnotify("STATUS=%s\nERRNO=%d", why, -r);
			return 1;
		}
		/* Before any peer is up: it hooks into srv.peers (remote.c). */
		remote_start(&srv);
	}
	r = server_listen(&srv);
	if (r < 0) {
		fprintf(stderr, "tensord: cannot listen on %s: %s\n", srv.cfg.socket_path,
			r == -EADDRINUSE ? "another tensord is running there"
			: r == -EPERM    ? "its directory is not safe to use (see above)"
					 : strerror(-r));
		sdnotify("STATUS=cannot listen on %s: %s\nERRNO=%d", srv.cfg.socket_path,
			 strerror(-r), -r);
		registry_fini(&srv.reg);
		quota_fini(&srv.quota);
		return 1;
	}
	if (srv.cfg.metrics_addr) {
		char why[300];

		r = metrics_http_start(srv.loop, srv.cfg.metrics_addr, srv.cfg.socket_mode,
				       srv.cfg.socket_gid, render_metrics, &srv, why, sizeof(why));
		if (r < 0) {
			fprintf(stderr, "tensord: --metrics %s\n", why);
			server_unlisten(&srv);
			registry_fini(&srv.reg);
			return 1;
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
	if (ready_fd >= 0) {
		if (write(ready_fd, "R", 1) != 1)
			log_warn("--ready-fd %d: %s, ignoring", ready_fd, strerror(errno));
		close(ready_fd);
	}
	sdnotify("READY=1\nSTATUS=listening on %s", srv.cfg.socket_path);

	uv_run(srv.loop, UV_RUN_DEFAULT);

	server_fini(&srv);
	peer_set_fini(&srv.peers);
	uv_loop_close(srv.loop);
	log_info("stopped");
	free((char *)srv.cfg.metrics_addr);
	free(srv.cfg.peer.listen);
	free(srv.cfg.peer.secret_file);
	return 0;
}
