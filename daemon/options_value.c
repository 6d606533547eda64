/*
 * The daemon's options: a value parsed strictly (options_int.h), the same
 * on the command line and in the config file. Numbers, sizes, octal
 * modes, uids and groups, each in the range of the variable it lands in;
 * the per-uid and per-connection limits; and how a refused value is shown
 * in the complaint.
 */
#include "options_int.h"

#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "watch.h"

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
	{ OPT_FDSTORE, NUM_DECIMAL, "a number of descriptors", 0, 1u << 20 },
	{ OPT_STATE_LOG_SIZE, NUM_SIZE, "a size", 4096, 1ull << 34 },
	{ OPT_READOPT_GRACE, NUM_DECIMAL, "a number of milliseconds", 0, 86400000 },
/* The per-uid shares: counts up to 2^32-1, sizes up to 2^64-1 bytes. */
#define QUOTA_NUM_N(kind) { OPT_QUOTA + QUOTA_##kind, NUM_DECIMAL, "a number", 1, UINT32_MAX },
#define QUOTA_NUM_SIZE(kind) { OPT_QUOTA + QUOTA_##kind, NUM_SIZE, "a size", 1, UINT64_MAX },
#define QUOTA_NUM_NONE(kind)
#define QUOTA(kind, flag, arg, usage, figure, unit, what, err, help) QUOTA_NUM_##arg(kind)
#include "daemon/base/quota.def"
#undef QUOTA
};

/* s, all digits of base, into *ret. 0, -EINVAL (not such digits) or -ERANGE. */
int opt_parse_digits(const char *s, int base, const char **ret_end, uint64_t *ret)
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
	int r = opt_parse_digits(s, 10, &end, &v);

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

/* arg for a message: as it is, or quoted and escaped when blanks, control
 * bytes or an empty string would hide what it was. */
const char *opt_shown(const char *arg, char *buf, size_t len)
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

const struct number_opt *opt_number(int opt)
{
	for (size_t i = 0; i < sizeof(number_opts) / sizeof(number_opts[0]); i++)
		if (number_opts[i].opt == opt)
			return &number_opts[i];
	return NULL;
}

/* Prints why arg is not a value of numeric option opt. Returns 2. */
static int number_refused(int opt, const char *arg, const char *extra)
{
	const struct number_opt *n = opt_number(opt);
	char buf[160];

	fprintf(stderr, "tensord: --%s %s: %snot %s from ", opt_name(opt),
		opt_shown(arg, buf, sizeof(buf)), extra, n->what);
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
int opt_parse_number(int opt, const char *arg, uint64_t *ret)
{
	const struct number_opt *n = opt_number(opt);
	const char *end = "";
	uint64_t v;
	int r;

	if (n->kind == NUM_SIZE)
		r = parse_size(arg, &v);
	else
		r = opt_parse_digits(arg, n->kind == NUM_OCTAL ? 8 : 10, &end, &v);
	if (r == 0 && *end)
		r = -EINVAL;
	if (r < 0 || v < n->min || v > n->max)
		return number_refused(opt, arg, "");
	*ret = v;
	return 0;
}

/* A per-uid or per-connection limit (or an exempt uid) into cfg. 0 or 2. */
int opt_parse_limit(int opt, uint64_t v, struct server_config *cfg)
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
int opt_parse_group(const char *arg, struct server_config *cfg)
{
	struct group *g = *arg ? getgrnam(arg) : NULL;
	uint64_t gid;

	if (g) {
		cfg->socket_gid = g->gr_gid;
		return 0;
	}
	if (!isdigit((unsigned char)*arg))
		return number_refused('g', arg, "no such group, and ");
	if (opt_parse_number('g', arg, &gid))
		return 2;
	cfg->socket_gid = (gid_t)gid;
	return 0;
}
