/*
 * tensord: the daemon. Parses arguments, sets up the registry and the
 * listening socket, wires the layers together (see server.h), runs the
 * libuv loop until SIGTERM or SIGINT.
 */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/sys.h"
#include "dispatch.h"
#include "log.h"
#include "reply.h"
#include "server.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: tensord [--socket PATH] [--capacity SIZE] [--pool SIZE] "
		   "[--log-level LEVEL]\n"
		   "               [--mode MODE] [--group GROUP] [--max-clients N] "
		   "[--ready-fd FD]\n"
		   "               [--max-clients-per-uid N] [--max-tensors-per-uid N] "
		   "[--max-fds-per-uid N]\n"
		   "               [--max-bytes-per-uid SIZE] [--max-waiters-per-conn N]\n"
		   "               [--max-fds-in-flight-per-conn N] [--quota-exempt-uid "
		   "UID]...\n"
		   "               [--show-all-metadata]\n"
		"\n"
		"  --socket PATH      where to listen (default: $TENSORD_SOCKET,\n"
		   "                     $XDG_RUNTIME_DIR/tensord.sock, "
		   "/run/tensord/tensord.sock\n"
		"                     for root, else /tmp/tensord-$UID.sock)\n"
		   "  --capacity SIZE    bytes of host memory to hand out; suffixes K M G "
		   "Ki Mi Gi\n"
		   "                     (default: half of physical memory, or of the "
		   "memory\n"
		"                     cgroup's limit when that is smaller)\n"
		   "  --pool SIZE        host memory kept allocated ahead of time for "
		   "large\n"
		"                     tensors; 0 keeps none (default: 1/16 of physical\n"
		"                     memory, at most 2Gi)\n"
		"  --log-level LEVEL  error, warn, info (default) or debug\n"
		"  --mode MODE        socket permissions, octal (default 0600)\n"
		"  --group GROUP      socket group\n"
		"  --max-clients N    connections served at once (default 4096)\n"
		   "  --max-clients-per-uid N      connections of one uid (default "
		   "max-clients/4)\n"
		   "  --max-tensors-per-uid N      tensors one uid may own (default "
		   "1048576)\n"
		   "  --max-fds-per-uid N          of those, tensors with a descriptor of "
		   "their\n"
		   "                               own (default: half of RLIMIT_NOFILE)\n"
		   "  --max-bytes-per-uid SIZE     bytes one uid may own (default: no "
		   "share)\n"
		   "  --max-waiters-per-conn N     attaches waiting per connection (default "
		   "256)\n"
		   "  --max-fds-in-flight-per-conn N  descriptors queued or unread per\n"
		   "                               connection (default 64)\n"
		   "  --quota-exempt-uid UID       counted, never refused (repeatable; "
		   "root\n"
		   "                               is not exempt unless named)\n"
		   "  --show-all-metadata          list/stat show every tensor to every "
		   "uid\n"
		"  --ready-fd FD      write 'R' to FD and close it once listening\n");
}

/* "512M", "1Gi", "4096": 0 or -EINVAL. K/M/G are decimal, Ki/Mi/Gi binary. */
static int parse_size(const char *s, uint64_t *ret)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		return -EINVAL;
	if (*end) {
		static const struct {
			const char *suf;
			uint64_t mul;
		} sufs[] = {
			{ "K", 1000ull },      { "M", 1000000ull },   { "G", 1000000000ull },
			{ "Ki", 1ull << 10 },  { "Mi", 1ull << 20 },  { "Gi", 1ull << 30 },
			{ "KB", 1000ull },     { "MB", 1000000ull },  { "GB", 1000000000ull },
			{ "T", 1000000000000ull }, { "Ti", 1ull << 40 },
		};
		size_t i;

		for (i = 0; i < sizeof(sufs) / sizeof(sufs[0]); i++)
			if (strcmp(end, sufs[i].suf) == 0)
				break;
		if (i == sizeof(sufs) / sizeof(sufs[0]))
			return -EINVAL;
		mul = sufs[i].mul;
	}
	if (v && mul > UINT64_MAX / v)
		return -EINVAL;
	*ret = v * mul;
	return 0;
}

/* Stops accepting, closes every client, frees everything; the loop then ends.
 */
static void server_stop(struct server *srv)
{
	if (srv->stopping)
		return;
	srv->stopping = true;
	log_info("stopping: %u clients, %llu tensors", srv->conns.n,
		 (unsigned long long)srv->reg.n_tensors);
	server_unlisten(srv);
	waiters_drop_all(&srv->waiters);
	conn_close_all(&srv->conns);
	conn_set_fini(&srv->conns);
	uv_close((uv_handle_t *)&srv->sigterm, NULL);
	uv_close((uv_handle_t *)&srv->sigint, NULL);
	uv_close((uv_handle_t *)&srv->sighup, NULL);
	uv_close((uv_handle_t *)&srv->sigusr1, NULL);
	uv_close((uv_handle_t *)&srv->sigusr2, NULL);
	uv_close((uv_handle_t *)&srv->spin, NULL);
}

/*
 * Signals that would kill the daemon by default, and its named tensors
 * with it: SIGUSR1 logs a summary of the state, the others only a line.
 * (The log is stderr, so SIGHUP has nothing to reopen.)
 */
static void on_other_signal(uv_signal_t *h, int signum)
{
	struct server *srv = h->data;
	uint32_t slabs;
	uint64_t slab_bytes;

	if (signum != SIGUSR1) {
		log_info("received %s, ignoring", signum == SIGHUP ? "SIGHUP" : "SIGUSR2");
		return;
	}
	backend_host_slab_stats(&slabs, &slab_bytes);
	log_info("state: %u clients, %llu tensors (%zu named), %llu leases, %u slabs holding "
		 "%llu bytes", srv->conns.n, (unsigned long long)srv->reg.n_tensors,
		 srv->reg.n_named, (unsigned long long)srv->reg.n_leases, slabs,
		 (unsigned long long)slab_bytes);
	for (int i = 0; i < srv->reg.n_devices; i++) {
		const struct reg_device *d = &srv->reg.devices[i];

		if (d->init_rc == 0)
			log_info("state: %s:%d: %u tensors, %llu of %llu bytes", d->ops->name,
				 d->device.device_id, d->tensors, (unsigned long long)d->used,
				 (unsigned long long)d->capacity);
	}
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

/* A per-uid or per-connection limit (or an exempt uid) into cfg. 0 or 2. */
static int parse_limit(int opt, const char *arg, struct server_config *cfg)
{
	struct quota_limits *lim = &cfg->limits;
	unsigned long long v;
	char *end;

	errno = 0;
	v = strtoull(arg, &end, 10);
	if (errno || end == arg || *end || *arg == '-' || v > UINT32_MAX || (!v && opt != 'U')) {
		fprintf(stderr, "tensord: %s: not a %s number\n", arg,
			opt == 'U' ? "uid" : "positive");
		return 2;
	}
	switch (opt) {
	case 'C':
		lim->per_uid[QUOTA_CLIENTS] = v;
		break;
	case 'T':
		lim->per_uid[QUOTA_TENSORS] = v;
		break;
	case 'D':
		lim->per_uid[QUOTA_FDS] = v;
		break;
	case 'W':
		lim->waiters_per_conn = (uint32_t)v;
		break;
	case 'F':
		lim->fds_in_flight_per_conn = (uint32_t)v;
		break;
	default:
		if (lim->n_exempt == QUOTA_EXEMPT_MAX) {
			fprintf(stderr, "tensord: --quota-exempt-uid: at most %d uids\n",
				QUOTA_EXEMPT_MAX);
			return 2;
		}
		lim->exempt[lim->n_exempt++] = (uint32_t)v;
		break;
	}
	return 0;
}

/* One option into cfg. 0, or 2 (the exit status) with the complaint printed. */
static int parse_option(int opt, const char *arg, struct server_config *cfg, int *ready_fd)
{
	char *end;

	switch (opt) {
	case 's':
		if (strlen(arg) >= sizeof(cfg->socket_path)) {
			fprintf(stderr, "tensord: --socket %s: longer than %zu bytes\n", arg,
				sizeof(cfg->socket_path) - 1);
			return 2;
		}
		snprintf(cfg->socket_path, sizeof(cfg->socket_path), "%s", arg);
		return 0;
	case 'c':
		if (parse_size(arg, &cfg->host_capacity) < 0 || !cfg->host_capacity) {
			fprintf(stderr, "tensord: --capacity %s: not a size (try 512Mi, 4G)\n",
				arg);
			return 2;
		}
		return 0;
	case 'p': {
		uint64_t pool;

		if (parse_size(arg, &pool) < 0) {
			fprintf(stderr, "tensord: --pool %s: not a size (try 0, 512Mi, 2G)\n", arg);
			return 2;
		}
		backend_host_set_pool(pool);
		return 0;
	}
	case 'l':
		if (log_level_parse(arg, &log_level) < 0) {
			fprintf(stderr, "tensord: --log-level %s: use error, warn, info or debug\n",
				arg);
			return 2;
		}
		return 0;
	case 'm': {
		unsigned long m = strtoul(arg, &end, 8);

		if (*end || m > 0777) {
			fprintf(stderr, "tensord: --mode %s: not an octal mode\n", arg);
			return 2;
		}
		cfg->socket_mode = (mode_t)m;
		return 0;
	}
	case 'g': {
		struct group *g = getgrnam(arg);
		unsigned long gid = strtoul(arg, &end, 10);

		if (g)
			cfg->socket_gid = g->gr_gid;
		else if (!*end)
			cfg->socket_gid = (gid_t)gid;
		else {
			fprintf(stderr, "tensord: --group %s: no such group\n", arg);
			return 2;
		}
		return 0;
	}
	case 'n':
		cfg->max_clients = (unsigned)strtoul(arg, &end, 10);
		if (*end || !cfg->max_clients) {
			fprintf(stderr, "tensord: --max-clients %s: not a positive number\n", arg);
			return 2;
		}
		return 0;
	case 'C':
	case 'T':
	case 'W':
	case 'F':
	case 'D':
	case 'U':
		return parse_limit(opt, arg, cfg);
	case 'B':
		if (parse_size(arg, &cfg->limits.per_uid[QUOTA_BYTES]) < 0 ||
		    !cfg->limits.per_uid[QUOTA_BYTES]) {
			fprintf(stderr, "tensord: --max-bytes-per-uid %s: not a size (try 4Gi)\n",
				arg);
			return 2;
		}
		return 0;
	case 'S':
		cfg->show_all_metadata = true;
		return 0;
	case 'r':
		*ready_fd = (int)strtol(arg, &end, 10);
		if (*end || *ready_fd < 0) {
			fprintf(stderr, "tensord: --ready-fd %s: not a descriptor\n", arg);
			return 2;
		}
		return 0;
	default:
		usage(stderr);
		return 2;
	}
}

/* argv into cfg. -1 to go on, else the status to exit with. */
static int parse_args(int argc, char **argv, struct server_config *cfg, int *ready_fd)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "capacity", required_argument, NULL, 'c' },
		{ "pool", required_argument, NULL, 'p' },
		{ "log-level", required_argument, NULL, 'l' },
		{ "mode", required_argument, NULL, 'm' },
		{ "group", required_argument, NULL, 'g' },
		{ "max-clients", required_argument, NULL, 'n' },
		{ "ready-fd", required_argument, NULL, 'r' },
		{ "max-clients-per-uid", required_argument, NULL, 'C' },
		{ "max-tensors-per-uid", required_argument, NULL, 'T' },
		{ "max-bytes-per-uid", required_argument, NULL, 'B' },
		{ "max-fds-per-uid", required_argument, NULL, 'D' },
		{ "max-waiters-per-conn", required_argument, NULL, 'W' },
		{ "max-fds-in-flight-per-conn", required_argument, NULL, 'F' },
		{ "quota-exempt-uid", required_argument, NULL, 'U' },
		{ "show-all-metadata", no_argument, NULL, 'S' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int opt;

	cfg->socket_mode = 0600;
	cfg->socket_gid = (gid_t)-1;
	cfg->max_clients = 4096;
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (opt == 'h') {
			usage(stdout);
			return 0;
		}
		if (parse_option(opt, optarg, cfg, ready_fd))
			return 2;
	}
	if (optind < argc) {
		fprintf(stderr, "tensord: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (!cfg->socket_path[0]) {
		if (tensord_default_socket_path(cfg->socket_path, sizeof(cfg->socket_path)) < 0) {
			fprintf(stderr, "tensord: default socket path too long; use --socket\n");
			return 2;
		}
		if (geteuid() == 0 && strcmp(cfg->socket_path, "/run/tensord/tensord.sock") == 0)
			mkdir("/run/tensord", 0755);
	}
	return -1;
}

/* The registry tells the waiters when a name is published. */
static void on_publish(void *ctx, struct tensor *t)
{
	waiters_wake(ctx, t->name, t->name_len);
}

/*
 * Polling after a request. Waking a sleeping process on another CPU costs
 * tens of microseconds on a VM, more than serving an attach; a client that
 * sends its next request within td_spin_budget_us() of the last reply
 * finds the loop awake (common/sys.c says when it is 0).
 */

static void on_spin(uv_idle_t *h)
{
	struct server *srv = h->data;

	if (now_ns() >= srv->spin_until)
		uv_idle_stop(h);
}

static void on_frame(struct conn *c, const uint8_t *payload, size_t len, void *ctx)
{
	struct server *srv = ctx;

	dispatch_frame(c, payload, len, ctx);
	if (srv->spin_ns && !srv->stopping) {
		srv->spin_until = now_ns() + srv->spin_ns;
		if (!uv_is_active((uv_handle_t *)&srv->spin))
			uv_idle_start(&srv->spin, on_spin);
	}
}

/* How each layer reaches the one above it. */
static const struct conn_handlers conn_handlers = {
	.on_open = dispatch_open,
	.on_frame = on_frame,
	.on_protocol_error = dispatch_protocol_error,
	.on_close = dispatch_close,
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

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		budget = rl.rlim_cur > 1u << 30 ? 1u << 30 : (unsigned)rl.rlim_cur;
	quota_default_limits(&lim, budget, srv->cfg.max_clients);
	quota_init(&srv->quota, &lim);
	log_info("shares per uid: %llu clients, %llu tensors (%llu with descriptors), "
		 "%s%llu "
		 "bytes; per connection %u waiters, %u descriptors in flight; %u of %u "
		 "descriptors kept for root",
		 (unsigned long long)lim.per_uid[QUOTA_CLIENTS],
		 (unsigned long long)lim.per_uid[QUOTA_TENSORS],
		 (unsigned long long)lim.per_uid[QUOTA_FDS],
		 lim.per_uid[QUOTA_BYTES] ? "" : "no share of ",
		 (unsigned long long)lim.per_uid[QUOTA_BYTES], lim.waiters_per_conn,
		 lim.fds_in_flight_per_conn, lim.fd_reserve, lim.fd_budget);
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
	srv->reg.quota = &srv->quota;
	srv->reg.show_all_metadata = srv->cfg.show_all_metadata;
	conn_set_init(&srv->conns, srv->loop, &conn_handlers, srv, sizeof(struct client),
		      srv->cfg.max_clients);
	srv->conns.quota = &srv->quota;
	srv->conns.fds_per_conn = srv->quota.lim.fds_in_flight_per_conn;
	waiters_init(&srv->waiters, srv->loop, dispatch_waiter_done, srv);
	srv->reg.on_publish = on_publish;
	srv->reg.on_publish_ctx = &srv->waiters;
	uv_idle_init(srv->loop, &srv->spin);
	srv->spin.data = srv;
	srv->spin_ns = (uint64_t)td_spin_budget_us() * 1000;
	return 0;
}

int main(int argc, char **argv)
{
	static struct server srv;
	int ready_fd = -1, r;

	r = parse_args(argc, argv, &srv.cfg, &ready_fd);
	if (r >= 0)
		return r;
	signal(SIGPIPE, SIG_IGN);
	raise_fd_limit();
	r = server_init(&srv);
	if (r < 0) {
		log_error("registry: %s", strerror(-r));
		return 1;
	}
	r = server_listen(&srv);
	if (r < 0) {
		fprintf(stderr, "tensord: cannot listen on %s: %s\n", srv.cfg.socket_path,
			r == -EADDRINUSE ? "another tensord is running there" : strerror(-r));
		registry_fini(&srv.reg);
		quota_fini(&srv.quota);
		return 1;
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

	uv_run(srv.loop, UV_RUN_DEFAULT);

	registry_fini(&srv.reg);
	quota_fini(&srv.quota);
	uv_loop_close(srv.loop);
	log_info("stopped");
	return 0;
}
