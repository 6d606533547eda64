/*
 * The daemon's options (options.h): the command line, --help, and the
 * config file under them, into a struct server_config.
 */
#include "options.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tensord/tensord.h>

#include "daemon/memory/backend.h"
#include "config.h"
#include "daemon/base/log.h"
#include "common/desc.h"
#include "daemon/remote/peer.h"
#include "daemon/remote/peer_auth.h"
#include "watch.h"

/* Read when it exists; --config FILE must exist. */
#define DEFAULT_CONFIG "/etc/tensord.conf"

/* Peering's options (docs/remote.md); the per-uid shares (quota.def) take values from OPT_QUOTA on. */
enum {
	OPT_NODE_NAME = 0x100,
	OPT_PEER_LISTEN,
	OPT_PEER,
	OPT_PEER_SECRET,
	OPT_EXPORT,
	OPT_REPLICA_KEEP,
	OPT_PEER_MAX_INFLIGHT,
	OPT_PEERS_DNS,
	OPT_PEER_MAX_REPLICA_BYTES,
	OPT_MAX_WATCH_QUEUE,
	OPT_QUOTA = 0x200,
};

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

/*
 * Numbers are parsed strictly, the same on the command line and in the
 * config file: digits only, no sign and no blank (strtoull alone takes
 * " -1" as 2^64-1 and "-5" as 2^64-5), and within the range of the
 * variable they land in; anything else is refused with the option, the
 * value and the range. Each numeric option and its range:
 */
enum number_kind { NUM_DECIMAL, NUM_OCTAL, NUM_SIZE };

static const struct number_opt {
	int opt;
	enum number_kind kind;
	const char *what; /* for the message: "not <what> from min to max" */
	uint64_t min, max;
} number_opts[] = {
	{ 'c', NUM_SIZE, "a size", 1, UINT64_MAX },
	{ 'p', NUM_SIZE, "a size", 0, UINT64_MAX - 1 }, /* UINT64_MAX: the default */
	{ 'm', NUM_OCTAL, "an octal mode", 0, 0777 },
	{ 'n', NUM_DECIMAL, "a number", 1, UINT_MAX },
	{ 'r', NUM_DECIMAL, "a descriptor", 0, INT_MAX },
	{ 'W', NUM_DECIMAL, "a number", 1, UINT32_MAX },
	{ 'F', NUM_DECIMAL, "a number", 1, UINT32_MAX },
	{ 'U', NUM_DECIMAL, "a uid", 0, UINT32_MAX - 1 }, /* (uid_t)-1 is no uid */
	{ 'g', NUM_DECIMAL, "a gid", 0, UINT32_MAX - 1 }, /* or a group name */
	{ 'H', NUM_DECIMAL, "a number of milliseconds", 0, UINT32_MAX },
	{ OPT_REPLICA_KEEP, NUM_DECIMAL, "a number of milliseconds", 0, 86400000 },
	{ OPT_PEER_MAX_INFLIGHT, NUM_SIZE, "a size", 1, UINT64_MAX },
	/* 0 would refuse every replica; the default (1/4 of the capacity) is none given. */
	{ OPT_PEER_MAX_REPLICA_BYTES, NUM_SIZE, "a size", 1, UINT64_MAX },
	{ OPT_MAX_WATCH_QUEUE, NUM_DECIMAL, "a number of events", 1, WATCH_QUEUE_MAX },
/* The per-uid shares: counts up to 2^32-1, sizes up to 2^64-1 bytes. */
#define QUOTA_NUM_N(kind) { OPT_QUOTA + QUOTA_##kind, NUM_DECIMAL, "a number", 1, UINT32_MAX },
#define QUOTA_NUM_SIZE(kind) { OPT_QUOTA + QUOTA_##kind, NUM_SIZE, "a size", 1, UINT64_MAX },
#define QUOTA_NUM_NONE(kind)
#define QUOTA(kind, flag, arg, usage, figure, unit, what, err, help) QUOTA_NUM_##arg(kind)
#include "daemon/base/quota.def"
#undef QUOTA
};

/* s, all digits of base, into *ret. 0, -EINVAL (not such digits) or -ERANGE. */
static int parse_digits(const char *s, int base, const char **ret_end, uint64_t *ret)
{
	unsigned long long v;
	char *end;

	if (*s < '0' || *s > (base == 8 ? '7' : '9'))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, base);
	if (errno == ERANGE)
		return -ERANGE;
	*ret_end = end;
	*ret = v;
	return 0;
}

/* "512M", "1Gi", "4096": K/M/G/T are decimal, Ki/Mi/Gi/Ti binary. 0, -EINVAL or -ERANGE. */
static int parse_size(const char *s, uint64_t *ret)
{
	static const struct {
		const char *suf;
		uint64_t mul;
	} sufs[] = {
		{ "", 1 },
		{ "K", 1000ull },
		{ "M", 1000000ull },
		{ "G", 1000000000ull },
		{ "Ki", 1ull << 10 },
		{ "Mi", 1ull << 20 },
		{ "Gi", 1ull << 30 },
		{ "KB", 1000ull },
		{ "MB", 1000000ull },
		{ "GB", 1000000000ull },
		{ "T", 1000000000000ull },
		{ "Ti", 1ull << 40 },
	};
	const char *end;
	uint64_t v;
	int r = parse_digits(s, 10, &end, &v);

	if (r < 0)
		return r;
	for (size_t i = 0; i < sizeof(sufs) / sizeof(sufs[0]); i++) {
		if (strcmp(end, sufs[i].suf) != 0)
			continue;
		if (v && sufs[i].mul > UINT64_MAX / v)
			return -ERANGE;
		*ret = v * sufs[i].mul;
		return 0;
	}
	return -EINVAL;
}

static const char *opt_name(int val);

/* arg for a message: as it is, or quoted and escaped when blanks, control
 * bytes or an empty string would hide what it was. */
static const char *shown(const char *arg, char *buf, size_t len)
{
	size_t n = 0;
	bool plain = *arg;

	for (const char *p = arg; *p && plain; p++)
		plain = isgraph((unsigned char)*p) && *p != '\'';
	if (plain)
		return arg;
	buf[n++] = '\'';
	for (const unsigned char *p = (const unsigned char *)arg; *p && n + 6 < len; p++) {
		if (isprint(*p) && *p != '\'' && *p != '\\')
			buf[n++] = (char)*p;
		else
			n += (size_t)snprintf(buf + n, len - n, "\\x%02x", *p);
	}
	buf[n++] = '\'';
	buf[n] = '\0';
	return buf;
}

static const struct number_opt *number_opt(int opt)
{
	for (size_t i = 0; i < sizeof(number_opts) / sizeof(number_opts[0]); i++)
		if (number_opts[i].opt == opt)
			return &number_opts[i];
	return NULL;
}

/* Prints why arg is not a value of numeric option opt. Returns 2. */
static int number_refused(int opt, const char *arg, const char *extra)
{
	const struct number_opt *n = number_opt(opt);
	char buf[160];

	fprintf(stderr, "tensord: --%s %s: %snot %s from ", opt_name(opt),
		shown(arg, buf, sizeof(buf)), extra, n->what);
	if (n->kind == NUM_OCTAL)
		fprintf(stderr, "%#llo to %#llo\n", (unsigned long long)n->min,
			(unsigned long long)n->max);
	else if (n->kind == NUM_SIZE)
		fprintf(stderr,
			"%llu to %llu bytes (digits and an optional suffix K, M, G, T, "
			"Ki, Mi, Gi, Ti, KB, MB or GB, e.g. 512Mi or 4G)\n",
			(unsigned long long)n->min, (unsigned long long)n->max);
	else
		fprintf(stderr, "%llu to %llu\n", (unsigned long long)n->min,
			(unsigned long long)n->max);
	return 2;
}

/* The value of numeric option opt, in its range. 0, or 2 with the complaint printed. */
static int parse_number(int opt, const char *arg, uint64_t *ret)
{
	const struct number_opt *n = number_opt(opt);
	const char *end = "";
	uint64_t v;
	int r;

	if (n->kind == NUM_SIZE)
		r = parse_size(arg, &v);
	else
		r = parse_digits(arg, n->kind == NUM_OCTAL ? 8 : 10, &end, &v);
	if (r == 0 && *end)
		r = -EINVAL;
	if (r < 0 || v < n->min || v > n->max)
		return number_refused(opt, arg, "");
	*ret = v;
	return 0;
}

/* A per-uid or per-connection limit (or an exempt uid) into cfg. 0 or 2. */
static int parse_limit(int opt, uint64_t v, struct server_config *cfg)
{
	struct quota_limits *lim = &cfg->limits;

	if (opt >= OPT_QUOTA && opt < OPT_QUOTA + QUOTA_KINDS) {
		lim->per_uid[opt - OPT_QUOTA] = v;
		return 0;
	}
	switch (opt) {
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

/* --group: a group's name, else a gid. 0, or 2 with the complaint printed. */
static int parse_group(const char *arg, struct server_config *cfg)
{
	struct group *g = *arg ? getgrnam(arg) : NULL;
	uint64_t gid;

	if (g) {
		cfg->socket_gid = g->gr_gid;
		return 0;
	}
	if (!isdigit((unsigned char)*arg))
		return number_refused('g', arg, "no such group, and ");
	if (parse_number('g', arg, &gid))
		return 2;
	cfg->socket_gid = (gid_t)gid;
	return 0;
}

/*
 * "HOST[:PORT]": HOST a name, an IPv4 address or a bracketed IPv6 one
 * (empty only where empty_ok), PORT 1-65535, PEER_DEFAULT_PORT when none.
 * 0 or -EINVAL.
 */
static int parse_hostport(const char *s, char *host, size_t host_len, uint16_t *port, bool empty_ok)
{
	const char *h = s, *colon, *end;
	size_t n;

	*port = PEER_DEFAULT_PORT;
	if (*s == '[') {
		end = strchr(s, ']');
		if (!end)
			return -EINVAL;
		h = s + 1;
		n = (size_t)(end - h);
		colon = end[1] == ':' ? end + 1 : NULL;
		if (end[1] && !colon)
			return -EINVAL;
	} else {
		colon = strchr(s, ':');
		if (colon && strchr(colon + 1, ':'))
			return -EINVAL; /* an IPv6 address goes in brackets */
		n = colon ? (size_t)(colon - s) : strlen(s);
	}
	if (n >= host_len || (n == 0 && !empty_ok))
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!isgraph((unsigned char)h[i]) || h[i] == '/' || h[i] == '[' || h[i] == ']')
			return -EINVAL;
	memcpy(host, h, n);
	host[n] = '\0';
	if (colon) {
		uint64_t v;
		const char *e;

		if (parse_digits(colon + 1, 10, &e, &v) < 0 || *e || v == 0 || v > 65535)
			return -EINVAL;
		*port = (uint16_t)v;
	}
	return 0;
}

/* --peers-dns HOST[:PORT] into pc. 0, or 2 with the complaint printed. */
static int parse_peers_dns(const char *arg, struct peer_config *pc)
{
	struct peer_dns_entry *e;
	char buf[160];

	if (pc->n_dns == PEER_DNS_MAX) {
		fprintf(stderr, "tensord: --peers-dns %s: at most %d names\n",
			shown(arg, buf, sizeof(buf)), PEER_DNS_MAX);
		return 2;
	}
	e = &pc->dns[pc->n_dns];
	if (parse_hostport(arg, e->host, sizeof(e->host), &e->port, false) < 0) {
		fprintf(stderr,
			"tensord: --peers-dns %s: not HOST[:PORT] (a DNS name, an IPv4 address or "
			"[IPv6]; a port from 1 to 65535)\n",
			shown(arg, buf, sizeof(buf)));
		return 2;
	}
	pc->n_dns++;
	return 0;
}

/* --node-name, --peer-listen, --peer, --peer-secret-file into pc. 0, or 2 with the complaint printed. */
static int parse_peer_option(int opt, const char *arg, struct peer_config *pc)
{
	char buf[160];
	const char *eq;
	struct peer_config_entry *e;

	switch (opt) {
	case OPT_NODE_NAME:
		if (!peer_name_valid(arg, strlen(arg))) {
			fprintf(stderr,
				"tensord: --node-name %s: not 1-%d bytes of [A-Za-z0-9._-]\n",
				shown(arg, buf, sizeof(buf)), PEER_NAME_MAX);
			return 2;
		}
		snprintf(pc->node_name, sizeof(pc->node_name), "%s", arg);
		return 0;
	case OPT_PEER_LISTEN:
		if (parse_hostport(arg, pc->listen_host, sizeof(pc->listen_host), &pc->listen_port,
				   true) < 0) {
			fprintf(stderr,
				"tensord: --peer-listen %s: not ADDR:PORT (an IP address, [IPv6] "
				"or nothing for every address; a port from 1 to 65535)\n",
				shown(arg, buf, sizeof(buf)));
			return 2;
		}
		free(pc->listen);
		pc->listen = strdup(arg);
		break;
	case OPT_PEER:
		eq = strchr(arg, '=');
		if (!eq || !peer_name_valid(arg, (size_t)(eq - arg))) {
			fprintf(stderr,
				"tensord: --peer %s: not NAME=HOST[:PORT] with NAME 1-%d bytes of "
				"[A-Za-z0-9._-]\n",
				shown(arg, buf, sizeof(buf)), PEER_NAME_MAX);
			return 2;
		}
		for (unsigned i = 0; i < pc->n_peers; i++)
			if (strlen(pc->peers[i].name) == (size_t)(eq - arg) &&
			    memcmp(pc->peers[i].name, arg, (size_t)(eq - arg)) == 0) {
				fprintf(stderr, "tensord: --peer %s: peer %s is named twice\n",
					shown(arg, buf, sizeof(buf)), pc->peers[i].name);
				return 2;
			}
		if (pc->n_peers == PEER_CONFIG_MAX) {
			fprintf(stderr, "tensord: --peer %s: at most %d peers\n",
				shown(arg, buf, sizeof(buf)), PEER_CONFIG_MAX);
			return 2;
		}
		e = &pc->peers[pc->n_peers];
		if (parse_hostport(eq + 1, e->host, sizeof(e->host), &e->port, false) < 0) {
			fprintf(stderr,
				"tensord: --peer %s: '%s' is not HOST[:PORT] (a name, an IPv4 "
				"address or [IPv6]; a port from 1 to 65535)\n",
				shown(arg, buf, sizeof(buf)), eq + 1);
			return 2;
		}
		memcpy(e->name, arg, (size_t)(eq - arg));
		e->name[eq - arg] = '\0';
		pc->n_peers++;
		return 0;
	default:
		free(pc->secret_file);
		pc->secret_file = strdup(arg);
		if (!pc->secret_file)
			break;
		return 0;
	}
	if (opt == OPT_PEER_LISTEN && pc->listen)
		return 0;
	fprintf(stderr, "tensord: --%s: out of memory\n", opt_name(opt));
	return 2;
}

/*
 * With peering on: a node name ($NODE_NAME or the host name by default),
 * a secret file, and no peer of this node's own name. 0, or 2 with the
 * complaint printed. The secret file itself is read at start (peer.c).
 */
static int check_peering(struct peer_config *pc)
{
	const char *from = "--node-name";
	char host[256], buf[160];

	if (!peer_config_on(pc))
		return 0;
	if (!pc->node_name[0]) {
		const char *env = getenv("NODE_NAME");

		if (env && *env) {
			from = "$NODE_NAME";
			snprintf(host, sizeof(host), "%s", env);
		} else {
			from = "the host name";
			if (gethostname(host, sizeof(host)) < 0)
				host[0] = '\0';
			host[sizeof(host) - 1] = '\0';
		}
		if (!peer_name_valid(host, strlen(host))) {
			fprintf(stderr,
				"tensord: node name %s (%s) is not 1-%d bytes of [A-Za-z0-9._-]; "
				"give one with --node-name\n",
				shown(host, buf, sizeof(buf)), from, PEER_NAME_MAX);
			return 2;
		}
		snprintf(pc->node_name, sizeof(pc->node_name), "%s", host);
	}
	if (!pc->secret_file) {
		fprintf(stderr, "tensord: --peer-listen, --peer and --peers-dns need "
				"--peer-secret-file PATH, the "
				"secret every peer shares (docs/remote.md, \"Authentication\")\n");
		return 2;
	}
	for (unsigned i = 0; i < pc->n_peers; i++)
		if (strcmp(pc->peers[i].name, pc->node_name) == 0) {
			fprintf(stderr,
				"tensord: --peer %s=%s: that is this node's own name (%s)\n",
				pc->peers[i].name, pc->peers[i].host, from);
			return 2;
		}
	return 0;
}

/* --export PREFIX[=PEER,...] into rc. 0, or 2 with the complaint printed. */
static int parse_export(const char *arg, struct remote_config *rc)
{
	const char *eq = strchr(arg, '=');
	size_t plen = eq ? (size_t)(eq - arg) : strlen(arg);
	struct remote_export *e;
	char why[300], buf[160];

	if (rc->n_exports == REMOTE_EXPORTS_MAX) {
		fprintf(stderr, "tensord: --export %s: at most %d rules\n",
			shown(arg, buf, sizeof(buf)), REMOTE_EXPORTS_MAX);
		return 2;
	}
	e = &rc->exports[rc->n_exports];
	memset(e, 0, sizeof(*e));
	if (plen && td_name_check(arg, plen, why, sizeof(why)) < 0) {
		fprintf(stderr, "tensord: --export %s: the prefix: %s\n",
			shown(arg, buf, sizeof(buf)), why);
		return 2;
	}
	memcpy(e->prefix, arg, plen);
	e->prefix[plen] = '\0';
	for (const char *p = eq ? eq + 1 : NULL; p;) {
		const char *comma = strchr(p, ',');
		size_t n = comma ? (size_t)(comma - p) : strlen(p);

		if (!peer_name_valid(p, n) || e->n_peers == REMOTE_EXPORT_PEERS_MAX) {
			fprintf(stderr,
				"tensord: --export %s: not PREFIX[=PEER,...] with each PEER 1-%d "
				"bytes of [A-Za-z0-9._-], at most %d of them\n",
				shown(arg, buf, sizeof(buf)), PEER_NAME_MAX,
				REMOTE_EXPORT_PEERS_MAX);
			return 2;
		}
		memcpy(e->peers[e->n_peers], p, n);
		e->peers[e->n_peers++][n] = '\0';
		p = comma ? comma + 1 : NULL;
	}
	rc->n_exports++;
	return 0;
}

/* One option into cfg. 0, or 2 (the exit status) with the complaint printed. */
static int parse_option(int opt, const char *arg, struct server_config *cfg, int *ready_fd)
{
	uint64_t v = 0;

	if (number_opt(opt) && opt != 'g' && parse_number(opt, arg, &v))
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
		return parse_group(arg, cfg);
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
		return parse_limit(opt, v, cfg);
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
		return parse_peer_option(opt, arg, &cfg->peer);
	case OPT_PEERS_DNS:
		return parse_peers_dns(arg, &cfg->peer);
	case OPT_EXPORT:
		return parse_export(arg, &cfg->remote);
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
	default:
		if (opt >= OPT_QUOTA && opt < OPT_QUOTA + QUOTA_KINDS)
			return parse_limit(opt, v, cfg);
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
	if (r < 0 && check_peering(&cfg->peer))
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
