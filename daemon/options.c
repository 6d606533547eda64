/*
 * The daemon's options (options.h): the option table, --help, and argv
 * and the config file under it applied in order into a struct
 * server_config. A value's parsing is options_value.c's, peering's and
 * remote attach's options options_peer.c's (options_int.h).
 */
#include "options_int.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tensord/tensord.h>

#include "daemon/memory/backend.h"
#include "config.h"
#include "daemon/base/log.h"
#include "daemon/remote/peer.h"
#include "watch.h"

/* Read when it exists; --config FILE must exist. */
#define DEFAULT_CONFIG "/etc/tensord.conf"

/* --help's lines for the per-uid shares, each description wrapped at 79 columns. */
static void usage_shares(FILE *f)
{
	static const struct {
		const char *flag, *arg, *usage;
	} rows[] = {
#define QUOTA(kind, flag, arg, usage, figure, unit, what, err, help) { flag, #arg, usage },
#include "daemon/base/quota.def"
#undef QUOTA
	};

	fprintf(f, "per-uid shares (a uid past one is refused; 0 is not a value):\n");
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		const char *p = rows[i].usage;
		int col;

		if (strcmp(rows[i].arg, "NONE") == 0)
			continue;
		col = fprintf(f, "  --%s %s", rows[i].flag, rows[i].arg);
		while (*p) {
			size_t n = strlen(p);

			/* The longest run of words that fits, from column 31. */
			if (col > 30)
				col = fprintf(f, "\n%31s", "") - 1;
			else
				col += fprintf(f, "%*s", 31 - col, "");
			if (n > 48)
				for (n = 48; n > 0 && p[n] != ' '; n--)
					;
			if (n == 0)
				n = strcspn(p, " ");
			col += fprintf(f, "%.*s", (int)n, p);
			p += n + (p[n] == ' ');
			col = 99; /* what follows starts a new line */
		}
		fputc('\n', f);
	}
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tensord [--socket PATH] [--capacity SIZE] [--pool SIZE] [--log-level "
		"LEVEL]\n"
		"               [--log-file PATH] [--mode MODE] [--group GROUP] [--max-clients N]\n"
		"               [--gpu-context-hold MS]\n"
		"               [--ready-fd FD] [--metrics HOST:PORT|unix:PATH]\n"
		"               [--metrics-per-uid] [--config FILE]\n"
		"               [--max-waiters-per-conn N] [--max-fds-in-flight-per-conn N]\n"
		"               [--max-watch-queue N]\n"
		"               [--quota-exempt-uid UID]... [--show-all-metadata] [--version]\n"
		"               [--max-...-per-uid N|SIZE]...\n"
		"               [--node-name NAME] [--peer-listen ADDR:PORT]\n"
		"               [--peer NAME=HOST[:PORT]]... [--peers-dns HOST[:PORT]]...\n"
		"               [--peer-secret-file PATH]\n"
		"\n"
		"  --socket PATH      where to listen (default: $TENSORD_SOCKET,\n"
		"                     $XDG_RUNTIME_DIR/tensord.sock, /run/tensord/tensord.sock\n"
		"                     for root, else /tmp/tensord-$UID/tensord.sock in a\n"
		"                     private directory; $TENSORD_TMPDIR replaces /tmp)\n"
		"  --capacity SIZE    bytes of host memory to hand out; suffixes K M G Ki Mi Gi\n"
		"                     (default: half of physical memory, or of the memory\n"
		"                     cgroup's limit when that is smaller)\n"
		"  --pool SIZE        host memory kept allocated ahead of time for "
		"large\n"
		"                     tensors; 0 keeps none (default: 1/16 of physical\n"
		"                     memory, at most 2Gi)\n"
		"  --gpu-context-hold MS  milliseconds a GPU keeps the daemon's context after\n"
		"                     its last tensor went, so that the next create need not\n"
		"                     make a new one; 0 releases it at once (default 5000)\n"
		"  --log-level LEVEL  error, warn, info (default) or debug\n"
		"  --log-file PATH    append the log to PATH instead of stderr; SIGHUP reopens it\n"
		"  --mode MODE        socket permissions, octal (default 0600)\n"
		"  --group GROUP      socket group\n"
		"  --max-clients N    connections served at once (default 4096)\n"
		"  --ready-fd FD      write 'R' to FD and close it once listening\n"
		"  --metrics ADDR     serve Prometheus metrics at http://ADDR/metrics; ADDR is\n"
		"                     HOST:PORT (e.g. 127.0.0.1:9464) or unix:PATH (default: off)\n"
		"  --metrics-per-uid  the endpoint also shows each uid's tensors and bytes\n"
		"                     (default: totals only: anyone who reaches it reads it)\n"
		"  --config FILE      'key = value' lines, keys as the long options above\n"
		"                     (default: " DEFAULT_CONFIG " when it exists); flags win\n"
		"  --max-waiters-per-conn N     attaches waiting per connection (default 1024)\n"
		"  --max-fds-in-flight-per-conn N  descriptors queued or unread per\n"
		"                               connection (default 64)\n"
		"  --max-watch-queue N  events a watch keeps queued for a client that does not\n"
		"                     read (1 to 65536, default 4096): a watch asking more\n"
		"                     gets this many, one asking none 1024 (or this, if less)\n"
		"  --quota-exempt-uid UID       counted, never refused (repeatable; root\n"
		"                               is not exempt unless named)\n"
		"  --show-all-metadata          list/stat show every tensor to every uid\n"
		"  --recycle on|off   new versions of a writer's tensors reuse the memory of its\n"
		"                     old ones, sealed F_SEAL_FUTURE_WRITE (default on;\n"
		"                     docs/recycle.md); off: fresh memory and F_SEAL_WRITE\n"
		"  --fdstore N        keep published tensors across a crash or restart in the\n"
		"                     service manager's descriptor store, at most N\n"
		"                     descriptors (default: $FDSTORE, which systemd sets\n"
		"                     from FileDescriptorStoreMax=; 0: off; docs/restart.md)\n"
		"  --state-log-size SIZE  rewrite the state log whole past SIZE, or past twice\n"
		"                     the state it began with (default 16Mi)\n"
		"  --readopt-grace MS after a restart, hold restored tensors this long for\n"
		"                     the clients that leased them to re-adopt their leases\n"
		"                     (default 30000; 0: no hold)\n"
		"  --holder DIR       without systemd: keep the store in the holder at DIR\n"
		"                     (tensord --hold DIR), which drains the daemon it\n"
		"                     served before and stops it once this one serves;\n"
		"                     --fdstore defaults to 65536 then\n"
		"tensord --hold DIR   run the holder: keeps daemons' stored descriptors\n"
		"                     across their restarts and upgrades (docs/restart.md)\n"
		"  --version          print the version and exit\n"
		"peering with other nodes' daemons (docs/remote.md; off unless --peer-listen,\n"
		"--peer or --peers-dns is given):\n"
		"  --node-name NAME   this node's name: 1-63 bytes of [A-Za-z0-9._-] (default:\n"
		"                     $NODE_NAME, else the host name)\n"
		"  --peer-listen ADDR:PORT  accept peers' control connections (TCP) there;\n"
		"                     ADDR numeric ([::] style for IPv6, empty for every\n"
		"                     address), PORT default 7439\n"
		"  --peer NAME=HOST[:PORT]  a peer to dial (repeatable); HOST may be a DNS\n"
		"                     name, resolved again at each dial\n"
		"  --peers-dns HOST[:PORT]  every address HOST resolves to is a peer, its name\n"
		"                     learnt from its handshake (repeatable; a Kubernetes\n"
		"                     headless Service); asked again every 10 s; this\n"
		"                     daemon's own address is recognised and skipped\n"
		"  --peer-secret-file PATH  the secret shared by every peer: at least 32\n"
		"                     bytes, a regular file of this uid or root, mode 0600 or\n"
		"                     0400; required with peering on\n"
		"  --export PREFIX[=PEER,...]  names under PREFIX may be pulled by the peers\n"
		"                     named (default: every peer) (repeatable); nothing is\n"
		"                     exported without one; a peer acts as uid 65534\n"
		"  --replica-keep MS  keep a pulled replica this long after its last lease\n"
		"                     (default 5000)\n"
		"  --peer-max-inflight SIZE  bytes being sent to one peer at once (default\n"
		"                     256Mi; one larger tensor still goes alone)\n"
		"  --peer-max-replica-bytes SIZE  bytes of replicas pulled from one peer\n"
		"                     (default: 1/4 of --capacity); past it, that peer's\n"
		"                     unleased replicas go first, oldest first, then EDQUOT\n");
	usage_shares(f);
	fprintf(f,
		"\n"
		"Under systemd: readiness through $NOTIFY_SOCKET, a listening socket through\n"
		"$LISTEN_FDS (tensord.socket), journal priorities when stderr is the journal.\n");
}

/* One option into cfg. 0, or 2 (the exit status) with the complaint printed. */
static int parse_option(int opt, const char *arg, struct server_config *cfg, int *ready_fd)
{
	uint64_t v = 0;

	if (opt_number(opt) && opt != 'g' && opt_parse_number(opt, arg, &v))
		return 2;
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
		cfg->host_capacity = v;
		return 0;
	case 'p':
		backend_host_set_pool(v);
		return 0;
	case 'H':
		backend_gpu_set_context_hold(v);
		return 0;
	case 'l':
		if (log_level_parse(arg, &log_level) < 0) {
			fprintf(stderr, "tensord: --log-level %s: use error, warn, info or debug\n",
				arg);
			return 2;
		}
		return 0;
	case 'f': {
		char why[600];

		if (log_open(arg, why, sizeof(why)) < 0) {
			fprintf(stderr, "tensord: --log-file %s: %s\n", arg, why);
			return 2;
		}
		return 0;
	}
	case 'm':
		cfg->socket_mode = (mode_t)v;
		return 0;
	case 'g':
		return opt_parse_group(arg, cfg);
	case 'n':
		cfg->max_clients = (unsigned)v;
		return 0;
	case 'M':
		/* A config file's value lives only as long as its line. */
		free((char *)cfg->metrics_addr);
		cfg->metrics_addr = strdup(arg);
		if (!cfg->metrics_addr) {
			fprintf(stderr, "tensord: --metrics: out of memory\n");
			return 2;
		}
		return 0;
	case 'W':
	case 'F':
	case 'U':
		return opt_parse_limit(opt, v, cfg);
	case 'S':
		cfg->show_all_metadata = true;
		return 0;
	case 'u':
		cfg->metrics_per_uid = true;
		return 0;
	case 'r':
		*ready_fd = (int)v;
		return 0;
	case OPT_NODE_NAME:
	case OPT_PEER_LISTEN:
	case OPT_PEER:
	case OPT_PEER_SECRET:
		return opt_parse_peer(opt, arg, &cfg->peer);
	case OPT_PEERS_DNS:
		return opt_parse_peers_dns(arg, &cfg->peer);
	case OPT_EXPORT:
		return opt_parse_export(arg, &cfg->remote);
	case OPT_REPLICA_KEEP:
		cfg->remote.replica_keep_ms = (uint32_t)v;
		return 0;
	case OPT_PEER_MAX_INFLIGHT:
		cfg->remote.max_inflight = v;
		return 0;
	case OPT_PEER_MAX_REPLICA_BYTES:
		cfg->remote.max_replica_bytes = v;
		return 0;
	case OPT_MAX_WATCH_QUEUE:
		cfg->max_watch_queue = (uint32_t)v;
		return 0;
	case OPT_RECYCLE:
		if (strcmp(arg, "on") != 0 && strcmp(arg, "off") != 0) {
			fprintf(stderr, "tensord: --recycle %s: use on or off\n", arg);
			return 2;
		}
		cfg->no_recycle = strcmp(arg, "off") == 0;
		return 0;
	case OPT_FDSTORE:
		cfg->fdstore_max = v;
		cfg->fdstore_set = true;
		return 0;
	case OPT_STATE_LOG_SIZE:
		cfg->state_log_size = v;
		return 0;
	case OPT_READOPT_GRACE:
		cfg->readopt_grace_ms = (uint32_t)v;
		cfg->readopt_grace_set = true;
		return 0;
	case OPT_HOLDER:
		if (strlen(arg) >= sizeof(cfg->holder) - 8) {
			fprintf(stderr, "tensord: --holder %s: longer than %zu bytes\n", arg,
				sizeof(cfg->holder) - 9);
			return 2;
		}
		snprintf(cfg->holder, sizeof(cfg->holder), "%s", arg);
		return 0;
	default:
		if (opt >= OPT_QUOTA && opt < OPT_QUOTA + QUOTA_KINDS)
			return opt_parse_limit(opt, v, cfg);
		usage(stderr);
		return 2;
	}
}

static const struct option long_opts[] = {
	{ "socket", required_argument, NULL, 's' },
	{ "capacity", required_argument, NULL, 'c' },
	{ "pool", required_argument, NULL, 'p' },
	{ "gpu-context-hold", required_argument, NULL, 'H' },
	{ "log-level", required_argument, NULL, 'l' },
	{ "log-file", required_argument, NULL, 'f' },
	{ "mode", required_argument, NULL, 'm' },
	{ "group", required_argument, NULL, 'g' },
	{ "max-clients", required_argument, NULL, 'n' },
	{ "ready-fd", required_argument, NULL, 'r' },
	{ "metrics", required_argument, NULL, 'M' },
	{ "metrics-per-uid", no_argument, NULL, 'u' },
	{ "max-waiters-per-conn", required_argument, NULL, 'W' },
	{ "max-fds-in-flight-per-conn", required_argument, NULL, 'F' },
	{ "quota-exempt-uid", required_argument, NULL, 'U' },
	{ "show-all-metadata", no_argument, NULL, 'S' },
	{ "config", required_argument, NULL, 'C' },
	{ "node-name", required_argument, NULL, OPT_NODE_NAME },
	{ "peer-listen", required_argument, NULL, OPT_PEER_LISTEN },
	{ "peer", required_argument, NULL, OPT_PEER },
	{ "peers-dns", required_argument, NULL, OPT_PEERS_DNS },
	{ "peer-secret-file", required_argument, NULL, OPT_PEER_SECRET },
	{ "export", required_argument, NULL, OPT_EXPORT },
	{ "replica-keep", required_argument, NULL, OPT_REPLICA_KEEP },
	{ "peer-max-inflight", required_argument, NULL, OPT_PEER_MAX_INFLIGHT },
	{ "peer-max-replica-bytes", required_argument, NULL, OPT_PEER_MAX_REPLICA_BYTES },
	{ "max-watch-queue", required_argument, NULL, OPT_MAX_WATCH_QUEUE },
	{ "recycle", required_argument, NULL, OPT_RECYCLE },
	{ "fdstore", required_argument, NULL, OPT_FDSTORE },
	{ "state-log-size", required_argument, NULL, OPT_STATE_LOG_SIZE },
	{ "holder", required_argument, NULL, OPT_HOLDER },
	{ "readopt-grace", required_argument, NULL, OPT_READOPT_GRACE },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
#define QUOTA_OPT_N(flag, kind) { flag, required_argument, NULL, OPT_QUOTA + QUOTA_##kind },
#define QUOTA_OPT_SIZE QUOTA_OPT_N
#define QUOTA_OPT_NONE(flag, kind)
#define QUOTA(kind, flag, arg, usage, figure, unit, what, err, help) QUOTA_OPT_##arg(flag, kind)
#include "daemon/base/quota.def"
#undef QUOTA
	{ NULL, 0, NULL, 0 },
};

/* The long name of option val, for messages. */
const char *opt_name(int val)
{
	for (const struct option *o = long_opts; o->name; o++)
		if (o->val == val)
			return o->name;
	return "?";
}

struct parsed {
	struct server_config *cfg;
	int *ready_fd;
};

/* A config file line (config.c): any option but --ready-fd and --config. */
static int apply_config(const struct option *o, const char *value, void *ctx)
{
	struct parsed *p = ctx;

	if (o->val == 'r' || o->val == 'C')
		return -ENOENT;
	return parse_option(o->val, value, p->cfg, p->ready_fd);
}

struct flag {
	int opt;
	const char *arg;
};

/*
 * One pass over argv: --help and --version answered, --config noted, the
 * other options kept in flags[] (argc entries) in order. -1 to go on, else
 * the status to exit with.
 */
static int collect_flags(int argc, char **argv, struct flag *flags, int *ret_n,
			 const char **ret_config)
{
	int opt;

	while ((opt = getopt_long(argc, argv, "hV", long_opts, NULL)) != -1) {
		switch (opt) {
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("tensord %s (protocol %d)\n", TENSORD_VERSION,
			       TENSORD_PROTOCOL_VERSION);
			return 0;
		case 'C':
			*ret_config = optarg;
			break;
		case '?':
			usage(stderr);
			return 2;
		default:
			flags[*ret_n].opt = opt;
			flags[(*ret_n)++].arg = optarg;
		}
	}
	return -1;
}

/*
 * argv, and the config file under it, into cfg. Flags are collected
 * first and applied after the file, so a flag overrides the file's line.
 * -1 to go on, else the status to exit with.
 */
int options_parse(int argc, char **argv, struct server_config *cfg, int *ready_fd)
{
	struct parsed p = { cfg, ready_fd };
	const char *config = NULL;
	struct flag *flags = calloc((size_t)argc, sizeof(*flags));
	int n = 0, r;

	if (!flags) {
		fprintf(stderr, "tensord: out of memory\n");
		return 2;
	}
	cfg->socket_mode = 0600;
	cfg->socket_gid = (gid_t)-1;
	cfg->max_clients = 4096;
	cfg->max_watch_queue = WATCH_QUEUE_MAX_DEFAULT;
	cfg->remote.replica_keep_ms = REMOTE_REPLICA_KEEP_MS_DEFAULT;
	cfg->remote.max_inflight = REMOTE_MAX_INFLIGHT_DEFAULT;
	r = collect_flags(argc, argv, flags, &n, &config);
	if (r < 0 && optind < argc) {
		fprintf(stderr, "tensord: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		r = 2;
	}
	if (r < 0 && config_load(config ? config : DEFAULT_CONFIG, config != NULL, long_opts,
				 apply_config, &p))
		r = 2;
	for (int i = 0; r < 0 && i < n; i++)
		if (parse_option(flags[i].opt, flags[i].arg, cfg, ready_fd))
			r = 2;
	free(flags);
	if (r < 0 && opt_check_peering(&cfg->peer))
		r = 2;
	if (r < 0 && !cfg->socket_path[0]) {
		if (tensord_default_socket_path(cfg->socket_path, sizeof(cfg->socket_path)) < 0) {
			fprintf(stderr, "tensord: default socket path too long; use --socket\n");
			return 2;
		}
		/* listen.c makes and checks its directory. */
	}
	return r;
}
