/*
 * The daemon's options (options.h): the command line, --help, and the
 * config file under them, into a struct server_config.
 */
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tensord/tensord.h>

#include "backend.h"
#include "config.h"
#include "log.h"

/* Read when it exists; --config FILE must exist. */
#define DEFAULT_CONFIG "/etc/tensord.conf"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tensord [--socket PATH] [--capacity SIZE] [--pool SIZE] [--log-level "
		"LEVEL]\n"
		"               [--log-file PATH] [--mode MODE] [--group GROUP] [--max-clients N]\n"
		"               [--ready-fd FD] [--metrics HOST:PORT|unix:PATH] [--config FILE]\n"
		"               [--max-clients-per-uid N] [--max-tensors-per-uid N] "
		"[--max-fds-per-uid N]\n"
		"               [--max-bytes-per-uid SIZE] [--max-waiters-per-conn N]\n"
		"               [--max-waiters-per-uid N] [--max-fds-in-flight-per-conn N]\n"
		"               [--quota-exempt-uid UID]...\n"
		"               [--show-all-metadata] [--version]\n"
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
		"  --log-level LEVEL  error, warn, info (default) or debug\n"
		"  --log-file PATH    append the log to PATH instead of stderr; SIGHUP reopens it\n"
		"  --mode MODE        socket permissions, octal (default 0600)\n"
		"  --group GROUP      socket group\n"
		"  --max-clients N    connections served at once (default 4096)\n"
		"  --ready-fd FD      write 'R' to FD and close it once listening\n"
		"  --metrics ADDR     serve Prometheus metrics at http://ADDR/metrics; ADDR is\n"
		"                     HOST:PORT (e.g. 127.0.0.1:9464) or unix:PATH (default: off)\n"
		"  --config FILE      'key = value' lines, keys as the long options above\n"
		"                     (default: " DEFAULT_CONFIG " when it exists); flags win\n"
		"  --max-clients-per-uid N      connections of one uid (default max-clients/4)\n"
		"  --max-tensors-per-uid N      tensors one uid may own (default 1048576)\n"
		"  --max-fds-per-uid N          of those, tensors with a descriptor of their\n"
		"                               own (default: half of RLIMIT_NOFILE)\n"
		"  --max-bytes-per-uid SIZE     bytes one uid may own (default: no share)\n"
		"  --max-waiters-per-conn N     attaches waiting per connection (default 256)\n"
		"  --max-waiters-per-uid N      attaches waiting per uid, all its connections\n"
		"                               (default 16 times the per-connection limit)\n"
		"  --max-fds-in-flight-per-conn N  descriptors queued or unread per\n"
		"                               connection (default 64)\n"
		"  --quota-exempt-uid UID       counted, never refused (repeatable; root\n"
		"                               is not exempt unless named)\n"
		"  --show-all-metadata          list/stat show every tensor to every uid\n"
		"  --version          print the version and exit\n"
		"\n"
		"Under systemd: readiness through $NOTIFY_SOCKET, a listening socket through\n"
		"$LISTEN_FDS (tensord.socket), journal priorities when stderr is the journal.\n");
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
			{ "K", 1000ull },          { "M", 1000000ull },  { "G", 1000000000ull },
			{ "Ki", 1ull << 10 },      { "Mi", 1ull << 20 }, { "Gi", 1ull << 30 },
			{ "KB", 1000ull },         { "MB", 1000000ull }, { "GB", 1000000000ull },
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

static const char *opt_name(int val);

/* A per-uid or per-connection limit (or an exempt uid) into cfg. 0 or 2. */
static int parse_limit(int opt, const char *arg, struct server_config *cfg)
{
	struct quota_limits *lim = &cfg->limits;
	unsigned long long v;
	char *end;

	errno = 0;
	v = strtoull(arg, &end, 10);
	if (errno || end == arg || *end || *arg == '-' || v > UINT32_MAX || (!v && opt != 'U')) {
		fprintf(stderr, "tensord: --%s %s: not a %s number\n", opt_name(opt), arg,
			opt == 'U' ? "uid" : "positive");
		return 2;
	}
	switch (opt) {
	case 'K':
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
	case 'w':
		lim->per_uid[QUOTA_WAITERS] = v;
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
	case 'f': {
		char why[600];

		if (log_open(arg, why, sizeof(why)) < 0) {
			fprintf(stderr, "tensord: --log-file %s: %s\n", arg, why);
			return 2;
		}
		return 0;
	}
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
	case 'M':
		/* A config file's value lives only as long as its line. */
		free((char *)cfg->metrics_addr);
		cfg->metrics_addr = strdup(arg);
		if (!cfg->metrics_addr) {
			fprintf(stderr, "tensord: --metrics: out of memory\n");
			return 2;
		}
		return 0;
	case 'K':
	case 'T':
	case 'W':
	case 'w':
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

static const struct option long_opts[] = {
	{ "socket", required_argument, NULL, 's' },
	{ "capacity", required_argument, NULL, 'c' },
	{ "pool", required_argument, NULL, 'p' },
	{ "log-level", required_argument, NULL, 'l' },
	{ "log-file", required_argument, NULL, 'f' },
	{ "mode", required_argument, NULL, 'm' },
	{ "group", required_argument, NULL, 'g' },
	{ "max-clients", required_argument, NULL, 'n' },
	{ "ready-fd", required_argument, NULL, 'r' },
	{ "metrics", required_argument, NULL, 'M' },
	{ "max-clients-per-uid", required_argument, NULL, 'K' },
	{ "max-tensors-per-uid", required_argument, NULL, 'T' },
	{ "max-bytes-per-uid", required_argument, NULL, 'B' },
	{ "max-fds-per-uid", required_argument, NULL, 'D' },
	{ "max-waiters-per-conn", required_argument, NULL, 'W' },
	{ "max-waiters-per-uid", required_argument, NULL, 'w' },
	{ "max-fds-in-flight-per-conn", required_argument, NULL, 'F' },
	{ "quota-exempt-uid", required_argument, NULL, 'U' },
	{ "show-all-metadata", no_argument, NULL, 'S' },
	{ "config", required_argument, NULL, 'C' },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ NULL, 0, NULL, 0 },
};

/* The long name of option val, for messages. */
static const char *opt_name(int val)
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
	if (r < 0 && !cfg->socket_path[0]) {
		if (tensord_default_socket_path(cfg->socket_path, sizeof(cfg->socket_path)) < 0) {
			fprintf(stderr, "tensord: default socket path too long; use --socket\n");
			return 2;
		}
		/* listen.c makes and checks its directory. */
	}
	return r;
}
