/*
 * The daemon as one object (server.h): built (server_init: the registry,
 * the connections, the waiters, the quarantine, and how each layer
 * reaches the one above it: conn_handlers, the waiters' and the
 * registry's callbacks, remote attach's hooks), stopped (server_stop) and
 * freed (server_fini); and the loop's polling after a frame
 * (server_spin_*). main.c reads the options, starts it and runs the loop.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/sys.h"
#include "daemon/base/log.h"
#include "daemon/base/ratelimit.h"
#include "daemon/memory/backend.h"
#include "daemon/memory/gpu_worker.h"
#include "dispatch.h"
#include "metrics.h"
#include "metrics_http.h"
#include "reply.h"
#include "daemon/base/sdnotify.h"
#include "server.h"

/* Stops accepting, closes every client, frees everything; the loop then ends.
 */
void server_stop(struct server *srv)
{
	if (srv->stopping)
		return;
	srv->stopping = true;
	/* What shutdown frees stays in the store for the next start. */
	state_freeze(srv->state);
	log_info("stopping: %u clients, %llu tensors", srv->conns.n,
		 (unsigned long long)srv->reg.n_tensors);
	sdnotify("STOPPING=1\nSTATUS=stopping: %u clients, %llu tensors", srv->conns.n,
		 (unsigned long long)srv->reg.n_tensors);
	server_unlisten(srv);
	remote_stop(&srv->remote);
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
	uv_close((uv_handle_t *)&srv->readopt_end, NULL);
	/* Creates still allocating complete after the loop (main()). */
	gpu_worker_set_notify(NULL, NULL);
	uv_close((uv_handle_t *)&srv->gpu_done, NULL);
}

/*
 * Drained, and told again (a holder that leaves this daemon to its
 * manager, $TENSORD_HOLD_STOP_DRAINED=0, once the next one serves): the
 * frozen state would answer its readers and peers with versions older
 * than the next daemon's, and their waits would never end here. Every
 * client connection and peer link is closed: the clients reconnect to
 * the next daemon and re-adopt their leases there, peers dial it. The
 * daemon then only waits for its manager to stop it.
 */
static void server_let_go(struct server *srv)
{
	if (srv->let_go)
		return;
	srv->let_go = true;
	log_info("the next daemon serves: letting %u clients and %u peer links go; exiting when "
		 "stopped",
		 srv->conns.n, srv->peers.n_up);
	sdnotify("STATUS=drained, the next daemon serves: waiting to be stopped");
	peer_set_let_go(&srv->peers);
	waiters_drop_all(&srv->waiters);
	conn_close_all(&srv->conns);
}

void server_drain(struct server *srv)
{
	if (srv->stopping)
		return;
	if (srv->draining) {
		server_let_go(srv);
		return;
	}
	/* Under systemd, or run by hand, nobody would take over: a stray
	 * SIGUSR2 must not leave a daemon that refuses every write. The test
	 * hook plays a tensord from before the drain, which ignored it. */
	if (!srv->cfg.holder[0] || getenv("TENSORD_TEST_NO_DRAIN")) {
		log_info("received SIGUSR2, ignoring%s",
			 srv->cfg.holder[0] ? ""
					    : ": only a daemon under a holder drains (--holder)");
		return;
	}
	srv->draining = true;
	/* Removals of steps already recorded go out; then the log, the store
	 * and every byte of memory are the next daemon's. */
	state_flush(srv->state);
	state_freeze(srv->state);
	server_unlisten(srv);
	/* The next daemon listens on the stored peer socket; a unix --metrics
	 * socket is removed for it to bind (a TCP one is shared meanwhile). */
	peer_set_drain(&srv->peers);
	if (srv->cfg.metrics_addr && strncmp(srv->cfg.metrics_addr, "unix:", 5) == 0)
		metrics_http_stop();
	log_info("draining for the next daemon: accepting nothing, recording nothing; reads "
		 "served on %u connections, a write closes its connection",
		 srv->conns.n);
	sdnotify("TENSORD_DRAINED=1\nSTATUS=drained: %u clients reading, %llu tensors",
		 srv->conns.n, (unsigned long long)srv->reg.n_tensors);
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

	/* Every step of the iteration is recorded (docs/restart.md): the slab
	 * slots it freed may be zeroed now. */
	backend_host_flush_frees();
	state_flush(srv->state);
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

/* How remote attach answers clients and polls after a peer's frame (remote.h). */
static void remote_frame_seen(void *ctx)
{
	server_spin_seen(ctx);
}

static void remote_frame_done(void *ctx)
{
	server_spin_arm(ctx);
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

/*
 * Recycled memory (docs/recycle.md): on unless --recycle off, and only
 * where the kernel enforces what it rests on.
 */
static void recycle_setup(struct server *srv)
{
	char why[200];

	if (srv->cfg.no_recycle) {
		log_info("recycled memory: off (--recycle off): every version takes fresh memory, "
			 "sealed F_SEAL_WRITE");
		return;
	}
	if (backend_host_probe_recycle(why, sizeof(why)) < 0) {
		log_warn("recycled memory: off: %s; every version takes fresh memory, sealed "
			 "F_SEAL_WRITE",
			 why);
		return;
	}
	srv->reg.recycle = true;
	log_debug("recycled memory: on (F_SEAL_FUTURE_WRITE enforced by this kernel)");
}

/* Everything but the listening socket. 0 or -errno. */
int server_init(struct server *srv)
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
	recycle_setup(srv);
	conn_set_init(&srv->conns, srv->loop, &conn_handlers, srv, sizeof(struct client),
		      srv->cfg.max_clients);
	srv->conns.quota = &srv->quota;
	srv->conns.fds_per_conn = srv->quota.lim.fds_in_flight_per_conn;
	waiters_init(&srv->waiters, srv->loop, dispatch_waiter_done, srv);
	quarantine_init(&srv->quarantine, srv->loop, &srv->reg, &srv->quota);
	srv->waiters.set_ready = dispatch_set_ready;
	srv->reg.on_commit = dispatch_on_commit;
	srv->reg.on_retired_gone = dispatch_on_retired_gone;
	srv->reg.on_commit_ctx = srv;
	srv->remote = (struct remote_env){
		.loop = srv->loop,
		.reg = &srv->reg,
		.peers = &srv->peers,
		.cfg = &srv->cfg.remote,
		.figs = &srv->remote_figs,
		.hooks = { .reply_status = dispatch_remote_status,
			   .reply = dispatch_remote_reply,
			   .attach_local = dispatch_attach_local,
			   .set_members = dispatch_set_members,
			   .set_answer = dispatch_set_answer,
			   .frame_seen = remote_frame_seen,
			   .frame_done = remote_frame_done,
			   .ctx = srv },
	};
	uv_idle_init(srv->loop, &srv->spin_idle);
	srv->spin_idle.data = srv;
	td_spin_init(&srv->spin);
	uv_prepare_init(srv->loop, &srv->bind_due);
	srv->bind_due.data = srv;
	uv_prepare_start(&srv->bind_due, on_bind_due);
	uv_unref((uv_handle_t *)&srv->bind_due); /* it keeps no loop running */
	uv_timer_init(srv->loop, &srv->bind_wake);
	uv_timer_init(srv->loop, &srv->readopt_end);
	srv->readopt_end.data = srv;
	uv_async_init(srv->loop, &srv->gpu_done, on_gpu_done);
	gpu_worker_set_notify(gpu_notify, &srv->gpu_done);
	return 0;
}

static void on_readopt_end(uv_timer_t *h)
{
	struct server *srv = h->data;
	uint32_t held = srv->reg.n_held;
	uint64_t freed = srv->reg.held_freed;

	registry_readopt_end(&srv->reg);
	log_info("restart: the grace period for re-adoption ended: %u restored tensors let go, "
		 "%llu of them freed (their names had gone), %llu leases re-adopted",
		 held, (unsigned long long)(srv->reg.held_freed - freed),
		 (unsigned long long)srv->reg.readopted);
}

void server_readopt_start(struct server *srv)
{
	uint32_t ms =
		srv->cfg.readopt_grace_set ? srv->cfg.readopt_grace_ms : SERVER_READOPT_GRACE_MS;

	if (!srv->reg.readopt)
		return;
	if (!ms) {
		registry_readopt_end(&srv->reg);
		return;
	}
	log_info("restart: restored tensors are held %u ms for their holders to re-adopt "
		 "their leases (--readopt-grace)",
		 ms);
	uv_timer_start(&srv->readopt_end, on_readopt_end, ms, 0);
}

/*
 * After the loop: let the GPU worker finish what it was doing and complete
 * those creates (their clients are gone, so the memory is released), then
 * free every tensor.
 */
void server_fini(struct server *srv)
{
	gpu_worker_set_notify(NULL, NULL);
	gpu_worker_drain();
	gpu_worker_complete();
	registry_fini(&srv->reg);
	quota_fini(&srv->quota);
}
