/*
 * daemon/options.c: every numeric option, on the command line and in the
 * config file, is taken only as digits within the range of the variable
 * it lands in (issue 18, item 17). For each option: its bounds are
 * accepted and land where they should; one past them, signs, blanks, hex,
 * exponents and 2^64 are refused with exit status 2 and a message naming
 * the option, the value and the range. Also --group by name and gid.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/options.h"

/* The calls options.c makes into the backends: recorded here. */
static uint64_t pool_set, hold_set;
void backend_host_set_pool(uint64_t budget)
{
	pool_set = budget;
}

void backend_gpu_set_context_hold(uint64_t ms)
{
	hold_set = ms;
}

static char dir[64], conf[96], errpath[96];
static char err[4096]; /* what the last parse printed on stderr */
static struct server_config cfg;
static int ready_fd;

/* options_parse() over argv (after "tensord"), stderr captured in err. */
static int parse_argv(int n, const char *const *args)
{
	char *argv[16];
	int saved, fd, r, argc = 0;
	ssize_t len;

	assert_true(n + 3 < 16);
	argv[argc++] = "tensord";
	argv[argc++] = "--config"; /* never /etc/tensord.conf */
	argv[argc++] = conf;
	for (int i = 0; i < n; i++)
		argv[argc++] = (char *)args[i];
	argv[argc] = NULL;
	memset(&cfg, 0, sizeof(cfg));
	ready_fd = -1;
	pool_set = 12345;
	hold_set = 12345;
	fflush(stderr);
	saved = dup(STDERR_FILENO);
	fd = open(errpath, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(saved >= 0 && fd >= 0);
	dup2(fd, STDERR_FILENO);
	optind = 0; /* getopt_long starts over */
	r = options_parse(argc, argv, &cfg, &ready_fd);
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	len = pread(fd, err, sizeof(err) - 1, 0);
	err[len > 0 ? len : 0] = '\0';
	close(fd);
	free((char *)cfg.metrics_addr);
	cfg.metrics_addr = NULL;
	free(cfg.peer.listen);
	free(cfg.peer.secret_file);
	cfg.peer.listen = cfg.peer.secret_file = NULL;
	return r;
}

static void write_conf(const char *text)
{
	FILE *f = fopen(conf, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* --name value on the command line. */
static int parse_flag(const char *name, const char *value)
{
	char flag[64];
	const char *args[] = { flag, value };

	write_conf("");
	snprintf(flag, sizeof(flag), "--%s", name);
	return parse_argv(2, args);
}

/* "name = value" in the config file. */
static int parse_conf_line(const char *name, const char *value)
{
	char line[256];

	snprintf(line, sizeof(line), "%s = %s\n", name, value);
	write_conf(line);
	return parse_argv(0, NULL);
}

/* Every numeric option: where it lands, and its range. */
enum kind { DEC, OCT, SIZE };
struct numopt {
	const char *name;
	enum kind kind;
	uint64_t min, max;
	const char *min_s, *max_s; /* how the message writes them */
	uint64_t (*landed)(void);
	bool cmdline_only;
};

static uint64_t got_capacity(void)
{
	return cfg.host_capacity;
}
static uint64_t got_pool(void)
{
	return pool_set;
}
static uint64_t got_hold(void)
{
	return hold_set;
}
static uint64_t got_bytes(void)
{
	return cfg.limits.per_uid[QUOTA_BYTES];
}
static uint64_t got_mode(void)
{
	return cfg.socket_mode;
}
static uint64_t got_max_clients(void)
{
	return cfg.max_clients;
}
static uint64_t got_ready_fd(void)
{
	return (uint64_t)ready_fd;
}
static uint64_t got_clients(void)
{
	return cfg.limits.per_uid[QUOTA_CLIENTS];
}
static uint64_t got_tensors(void)
{
	return cfg.limits.per_uid[QUOTA_TENSORS];
}
static uint64_t got_fds(void)
{
	return cfg.limits.per_uid[QUOTA_FDS];
}
static uint64_t got_waiters_conn(void)
{
	return cfg.limits.waiters_per_conn;
}
static uint64_t got_waiters_uid(void)
{
	return cfg.limits.per_uid[QUOTA_WAITERS];
}
static uint64_t got_in_flight(void)
{
	return cfg.limits.fds_in_flight_per_conn;
}
static uint64_t got_exempt(void)
{
	return cfg.limits.n_exempt == 1 ? cfg.limits.exempt[0] : UINT64_MAX;
}
static uint64_t got_gid(void)
{
	return cfg.socket_gid;
}

#define U32 "4294967295"
#define U64 "18446744073709551615"
static const struct numopt numopts[] = {
	{ "capacity", SIZE, 1, UINT64_MAX, "1", U64, got_capacity, false },
	{ "pool", SIZE, 0, UINT64_MAX - 1, "0", "18446744073709551614", got_pool, false },
	{ "gpu-context-hold", DEC, 0, UINT32_MAX, "0", U32, got_hold, false },
	{ "max-bytes-per-uid", SIZE, 1, UINT64_MAX, "1", U64, got_bytes, false },
	{ "mode", OCT, 0, 0777, "0", "0777", got_mode, false },
	{ "max-clients", DEC, 1, UINT_MAX, "1", U32, got_max_clients, false },
	{ "ready-fd", DEC, 0, INT_MAX, "0", "2147483647", got_ready_fd, true },
	{ "max-clients-per-uid", DEC, 1, UINT32_MAX, "1", U32, got_clients, false },
	{ "max-tensors-per-uid", DEC, 1, UINT32_MAX, "1", U32, got_tensors, false },
	{ "max-fds-per-uid", DEC, 1, UINT32_MAX, "1", U32, got_fds, false },
	{ "max-waiters-per-conn", DEC, 1, UINT32_MAX, "1", U32, got_waiters_conn, false },
	{ "max-waiters-per-uid", DEC, 1, UINT32_MAX, "1", U32, got_waiters_uid, false },
	{ "max-fds-in-flight-per-conn", DEC, 1, UINT32_MAX, "1", U32, got_in_flight, false },
	{ "quota-exempt-uid", DEC, 0, UINT32_MAX - 1, "0", "4294967294", got_exempt, false },
	{ "group", DEC, 0, UINT32_MAX - 1, "0", "4294967294", got_gid, false },
};

/* Refused by every numeric option, whatever its range. */
static const char *const always_bad[] = {
	"",
	" ",
	"-1",
	"-5",
	"+1",
	" 1",
	"1 ",
	"\t1",
	"1\n",
	"1x",
	"0x10",
	"1e3",
	"1.0",
	"--1",
	"1-",
	"１",
	"18446744073709551616",
	"99999999999999999999999999",
};

static void fmt_num(char *buf, size_t len, enum kind kind, uint64_t v)
{
	snprintf(buf, len, kind == OCT ? "%#llo" : "%llu", (unsigned long long)v);
}

/* Non-empty, all printable ASCII. */
static bool printable(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (*s < 0x20 || *s > 0x7e)
			return false;
	return true;
}

static const struct numopt *numopt(const char *name)
{
	for (size_t i = 0; i < sizeof(numopts) / sizeof(numopts[0]); i++)
		if (strcmp(numopts[i].name, name) == 0)
			return &numopts[i];
	fail_msg("no option %s", name);
	return NULL;
}

/* The value is refused: status 2, nothing landed, and a message naming it. */
static void assert_refused(const struct numopt *o, const char *value, int r)
{
	char want[160];

	if (r != 2)
		fail_msg("--%s '%s': status %d, want 2", o->name, value, r);
	snprintf(want, sizeof(want), "tensord: --%s ", o->name);
	if (!strstr(err, want))
		fail_msg("--%s '%s': message does not name the option: %s", o->name, value, err);
	snprintf(want, sizeof(want), "from %s to %s", o->min_s, o->max_s);
	if (!strstr(err, want))
		fail_msg("--%s '%s': message does not give the range '%s': %s", o->name, value,
			 want, err);
	/* The value as given: as is, or quoted when it has blanks (or is empty). */
	if (printable(value) && !strchr(value, ' ') && !strstr(err, value))
		fail_msg("--%s '%s': message does not show the value: %s", o->name, value, err);
	if (strchr(value, ' ') || !*value) {
		snprintf(want, sizeof(want), "'%s'", value);
		if (!strstr(err, want))
			fail_msg("--%s '%s': value not quoted: %s", o->name, value, err);
	}
}

static void assert_accepted(const struct numopt *o, const char *value, uint64_t want, int r)
{
	if (r != -1)
		fail_msg("--%s '%s': status %d, want -1 (go on): %s", o->name, value, r, err);
	if (o->landed() != want)
		fail_msg("--%s '%s': landed %llu, want %llu", o->name, value,
			 (unsigned long long)o->landed(), (unsigned long long)want);
}

static void test_every_numeric_option_on_the_command_line(void **state)
{
	char v[64];

	for (size_t i = 0; i < sizeof(numopts) / sizeof(numopts[0]); i++) {
		const struct numopt *o = &numopts[i];

		/* The bounds, and a value in between. */
		assert_accepted(o, o->min_s, o->min, parse_flag(o->name, o->min_s));
		assert_accepted(o, o->max_s, o->max, parse_flag(o->name, o->max_s));
		fmt_num(v, sizeof(v), o->kind, o->min + 7);
		assert_accepted(o, v, o->min + 7, parse_flag(o->name, v));
		/* One past each bound. */
		if (o->max < UINT64_MAX) {
			fmt_num(v, sizeof(v), o->kind, o->max + 1);
			assert_refused(o, v, parse_flag(o->name, v));
		}
		if (o->min > 0) {
			fmt_num(v, sizeof(v), o->kind, o->min - 1);
			assert_refused(o, v, parse_flag(o->name, v));
		}
		for (size_t j = 0; j < sizeof(always_bad) / sizeof(always_bad[0]); j++)
			assert_refused(o, always_bad[j], parse_flag(o->name, always_bad[j]));
	}
}

static void test_every_numeric_option_in_the_config_file(void **state)
{
	static const char *const bad[] = {
		"-1", "-5", "+1", "0x10", "1e3", "18446744073709551616"
	};
	char v[64];

	for (size_t i = 0; i < sizeof(numopts) / sizeof(numopts[0]); i++) {
		const struct numopt *o = &numopts[i];

		if (o->cmdline_only)
			continue;
		/* Blanks around the value are the file's layout, not part of it. */
		assert_accepted(o, o->max_s, o->max, parse_conf_line(o->name, o->max_s));
		fmt_num(v, sizeof(v), o->kind, o->min + 7);
		assert_accepted(o, v, o->min + 7, parse_conf_line(o->name, v));
		for (size_t j = 0; j < sizeof(bad) / sizeof(bad[0]); j++) {
			char line[96];

			assert_refused(o, bad[j], parse_conf_line(o->name, bad[j]));
			snprintf(line, sizeof(line), ":1: bad value for '%s'", o->name);
			if (!strstr(err, line))
				fail_msg("%s = %s: the file's line is not named: %s", o->name,
					 bad[j], err);
		}
	}
}

/* The examples of the issue, one by one. */
static void test_issue_examples(void **state)
{
	const struct numopt *max_clients = numopt("max-clients"), *capacity = numopt("capacity");

	assert_int_equal(parse_conf_line("max-clients", "-5"), 2);
	assert_non_null(strstr(err, "--max-clients -5: not a number from 1 to 4294967295"));
	assert_refused(max_clients, "4294967297", parse_flag("max-clients", "4294967297"));
	assert_refused(capacity, " -1", parse_flag("capacity", " -1"));
	assert_non_null(strstr(err, "--capacity ' -1': not a size from 1 to " U64 " bytes"));
	assert_int_equal(parse_flag("ready-fd", "4294967299"), 2);
	assert_non_null(
		strstr(err, "--ready-fd 4294967299: not a descriptor from 0 to 2147483647"));
	assert_int_equal(parse_flag("group", ""), 2);
	assert_non_null(strstr(err, "--group '': no such group, and not a gid"));
}

static void test_sizes_and_groups(void **state)
{
	const struct numopt *capacity = numopt("capacity"), *group = numopt("group");
	struct group *root = getgrgid(0);

	assert_accepted(capacity, "1Ki", 1024, parse_flag("capacity", "1Ki"));
	assert_accepted(capacity, "3G", 3000000000ull, parse_flag("capacity", "3G"));
	assert_accepted(capacity, "17179869183Gi", 17179869183ull << 30,
			parse_flag("capacity", "17179869183Gi"));
	assert_refused(capacity, "17179869184Gi", parse_flag("capacity", "17179869184Gi"));
	assert_refused(capacity, "0Ki", parse_flag("capacity", "0Ki"));
	assert_refused(capacity, "1 Ki", parse_flag("capacity", "1 Ki"));
	assert_refused(capacity, "1ki", parse_flag("capacity", "1ki"));
	assert_refused(capacity, "1Kii", parse_flag("capacity", "1Kii"));
	assert_refused(numopt("mode"), "8", parse_flag("mode", "8")); /* not octal */
	assert_refused(numopt("mode"), "0o7", parse_flag("mode", "0o7"));
	if (root)
		assert_accepted(group, root->gr_name, 0, parse_flag("group", root->gr_name));
	assert_int_equal(parse_flag("group", "no-such-group-tensord"), 2);
	assert_non_null(strstr(err, "--group no-such-group-tensord: no such group, and not a "
				    "gid from 0 to 4294967294"));
	/* An option given twice: the last one counts, each is checked. */
	{
		const char *args[] = { "--max-clients", "9", "--max-clients", "10" };
		const char *bad[] = { "--max-clients", "9", "--max-clients", "-1" };

		write_conf("");
		assert_int_equal(parse_argv(4, args), -1);
		assert_int_equal(cfg.max_clients, 10);
		assert_int_equal(parse_argv(4, bad), 2);
	}
}

/* Peering's options (docs/remote.md): where they land, defaults, refusals. */
static void test_peer_options(void **state)
{
	const char *on[] = { "--node-name",
			     "n1",
			     "--peer-listen",
			     "127.0.0.1:7000",
			     "--peer",
			     "b=host.example:7001",
			     "--peer",
			     "c=[::1]",
			     "--peer-secret-file",
			     "/etc/tensord/peer.key" };
	const char *own[] = { "--node-name", "n1", "--peer", "n1=h", "--peer-secret-file", "/k" };
	const char *twice[] = { "--peer", "b=h", "--peer", "b=i", "--peer-secret-file", "/k" };
	const char *nosecret[] = { "--node-name", "n1", "--peer-listen", ":7439" };
	const char *envname[] = { "--peer-listen", ":7439", "--peer-secret-file", "/k" };
	static const struct {
		const char *flag, *value, *says;
	} bad[] = {
		{ "peer", "b", "--peer b: not NAME=HOST[:PORT]" },
		{ "peer", "=h", "--peer =h: not NAME=HOST[:PORT]" },
		{ "peer", "b c=h", "not NAME=HOST[:PORT]" },
		{ "peer", "b=", "'' is not HOST[:PORT]" },
		{ "peer", "b=h:0", "'h:0' is not HOST[:PORT]" },
		{ "peer", "b=h:65536", "'h:65536' is not HOST[:PORT]" },
		{ "peer", "b=::1", "'::1' is not HOST[:PORT]" },
		{ "peer", "b=[::1", "'[::1' is not HOST[:PORT]" },
		{ "peer", "b=h:-1", "is not HOST[:PORT]" },
		{ "peer-listen", "1.2.3.4:99999", "--peer-listen 1.2.3.4:99999: not ADDR:PORT" },
		{ "peer-listen", "1.2.3.4:", "not ADDR:PORT" },
		{ "node-name", "a/b", "--node-name a/b: not 1-63 bytes" },
		{ "node-name", "a123456789012345678901234567890123456789012345678901234567890123",
		  "not 1-63 bytes" },
	};

	(void)state;
	write_conf("");
	assert_int_equal(parse_argv(10, on), -1);
	assert_string_equal(cfg.peer.node_name, "n1");
	assert_string_equal(cfg.peer.listen_host, "127.0.0.1");
	assert_int_equal(cfg.peer.listen_port, 7000);
	assert_int_equal(cfg.peer.n_peers, 2);
	assert_string_equal(cfg.peer.peers[0].name, "b");
	assert_string_equal(cfg.peer.peers[0].host, "host.example");
	assert_int_equal(cfg.peer.peers[0].port, 7001);
	assert_string_equal(cfg.peer.peers[1].name, "c");
	assert_string_equal(cfg.peer.peers[1].host, "::1");
	assert_int_equal(cfg.peer.peers[1].port, 7439);

	/* In the file: a line per peer, and the flags' peers after them. */
	write_conf("node-name = n2\npeer = x=h1\npeer = y=h2:9\npeer-secret-file = /k\n");
	assert_int_equal(parse_argv(0, NULL), -1);
	assert_int_equal(cfg.peer.n_peers, 2);
	assert_string_equal(cfg.peer.peers[1].host, "h2");
	assert_int_equal(cfg.peer.peers[1].port, 9);
	assert_string_equal(cfg.peer.node_name, "n2");

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(parse_flag(bad[i].flag, bad[i].value), 2);
		if (!strstr(err, bad[i].says))
			fail_msg("--%s %s: said '%s', not '%s'", bad[i].flag, bad[i].value, err,
				 bad[i].says);
	}
	write_conf("");
	assert_int_equal(parse_argv(6, own), 2);
	assert_non_null(strstr(err, "--peer n1=h: that is this node's own name"));
	assert_int_equal(parse_argv(6, twice), 2);
	assert_non_null(strstr(err, "peer b is named twice"));
	assert_int_equal(parse_argv(4, nosecret), 2);
	assert_non_null(strstr(err, "need --peer-secret-file PATH"));

	/* The node's name: $NODE_NAME by default, checked as a flag's would be. */
	setenv("NODE_NAME", "from-env", 1);
	assert_int_equal(parse_argv(4, envname), -1);
	assert_string_equal(cfg.peer.node_name, "from-env");
	assert_int_equal(cfg.peer.listen_port, 7439);
	assert_string_equal(cfg.peer.listen_host, "");
	setenv("NODE_NAME", "no good", 1);
	assert_int_equal(parse_argv(4, envname), 2);
	assert_non_null(strstr(err, "node name 'no good' ($NODE_NAME) is not 1-63 bytes"));
	unsetenv("NODE_NAME");

	/* Peering off: nothing of it is checked or set. */
	assert_int_equal(parse_flag("capacity", "1G"), -1);
	assert_int_equal(cfg.peer.n_peers, 0);
	assert_null(cfg.peer.listen);
	assert_string_equal(cfg.peer.node_name, "");
}

/* Remote attach's options (docs/operating.md, "Remote attach"): rules, defaults, refusals. */
static void test_export_options(void **state)
{
	const char *args[] = {
		"--export", "model/=b,c",          "--export", "open/", "--replica-keep",
		"250",      "--peer-max-inflight", "1Mi"
	};
	static const struct {
		const char *value, *says;
	} bad[] = {
		{ "has space/", "--export 'has space/': the prefix: name" },
		{ "model/=b c", "not PREFIX[=PEER,...]" },
		{ "model/=", "not PREFIX[=PEER,...]" },
		{ "model/=b,,c", "not PREFIX[=PEER,...]" },
	};

	(void)state;
	write_conf("");
	assert_int_equal(parse_argv(0, NULL), -1);
	assert_int_equal(cfg.remote.n_exports, 0); /* nothing exported by default */
	assert_int_equal(cfg.remote.replica_keep_ms, REMOTE_REPLICA_KEEP_MS_DEFAULT);
	assert_true(cfg.remote.max_inflight == REMOTE_MAX_INFLIGHT_DEFAULT);
	assert_int_equal(parse_argv(8, args), -1);
	assert_int_equal(cfg.remote.n_exports, 2);
	assert_string_equal(cfg.remote.exports[0].prefix, "model/");
	assert_int_equal(cfg.remote.exports[0].n_peers, 2);
	assert_string_equal(cfg.remote.exports[0].peers[1], "c");
	assert_string_equal(cfg.remote.exports[1].prefix, "open/");
	assert_int_equal(cfg.remote.exports[1].n_peers, 0);
	assert_int_equal(cfg.remote.replica_keep_ms, 250);
	assert_true(cfg.remote.max_inflight == 1u << 20);
	/* In the file: a line per rule. */
	write_conf("export = a/\nexport = b/=x\n");
	assert_int_equal(parse_argv(0, NULL), -1);
	assert_int_equal(cfg.remote.n_exports, 2);
	assert_string_equal(cfg.remote.exports[1].peers[0], "x");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(parse_flag("export", bad[i].value), 2);
		if (!strstr(err, bad[i].says))
			fail_msg("--export %s: said '%s', not '%s'", bad[i].value, err,
				 bad[i].says);
	}
	write_conf("");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_numeric_option_on_the_command_line),
		cmocka_unit_test(test_every_numeric_option_in_the_config_file),
		cmocka_unit_test(test_issue_examples),
		cmocka_unit_test(test_sizes_and_groups),
		cmocka_unit_test(test_peer_options),
		cmocka_unit_test(test_export_options),
	};
	char cmd[128];
	int r;

	snprintf(dir, sizeof(dir), "/tmp/tensord-options-%d", (int)getpid());
	assert_int_equal(mkdir(dir, 0700), 0);
	snprintf(conf, sizeof(conf), "%s/tensord.conf", dir);
	snprintf(errpath, sizeof(errpath), "%s/stderr", dir);
	setenv("TENSORD_SOCKET", "/nonexistent/tensord.sock", 1);
	r = cmocka_run_group_tests(tests, NULL, NULL);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	return system(cmd) == 0 ? r : 1;
}
