/*
 * tensorctl: the command-line client of tensord.
 *
 * It uses only the public libtensord API. Exit status: 0 on success, 1 when
 * an operation fails (the reason on stderr), 2 on a usage error, 124 when
 * wait timed out (docs/tensorctl.md). This file
 * parses the command line and runs one command (commands.c); output.c
 * holds the formats, which docs/tensorctl.md describes.
 */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tensord/tensord.h>

#include "tensorctl.h"

/* The end of --help, after the commands. */
static const char usage_tail[] =
	"--socket PATH (else $TENSORD_SOCKET, else the default path, then\n"
	"/run/tensord/tensord.sock) picks the daemon; $TENSORD_DAEMON_UID names a daemon\n"
	"user to trust besides yourself and root;\n"
	"-h/--help, --version. Options may come before or after the arguments.\n"
	"exit status: 0 success, 1 operation error, 2 usage error, 124 timed out\n";

/*
 * One command: what runs it, how many positionals and which options it
 * takes, its usage line (for errors and --help) and what it does (--help).
 */
struct command {
	const char *name;
	int (*run)(tensord_client *c, const struct args *a);
	int min_pos, max_pos;
	unsigned opts;
	const char *usage;
	const char *help;
};

static int __attribute__((format(printf, 2, 3)))
usage_error(const char *cmd_usage, const char *fmt, ...)
{
	va_list ap;

	fputs("tensorctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nusage: tensorctl [--socket PATH] %s\n",
		cmd_usage ? cmd_usage : "COMMAND [ARGS]   (see tensorctl --help)");
	return EXIT_USAGE;
}

static const struct command commands[] = {
	{ "ls", cmd_ls, 0, 1, OPT_JSON | OPT_GROUP, "ls [PREFIX] [--group prefix|commit] [--json]",
	  "list tensors whose name starts with PREFIX (--group: a\nrow per prefix or commit)" },
	{ "stat", cmd_stat, 1, 1, OPT_JSON, "stat NAME [--json]", "describe one tensor" },
	{ "put", cmd_put, 2, 2, OPT_MUTABLE | OPT_MODE | OPT_LIFETIME | OPT_FORCE | OPT_JSON,
	  "put NAME FILE.npy | put PREFIX FILE.npz|FILE.safetensors [--json] [--force] "
	  "[--mutable] [--mode MODE] [--lifetime persistent|connection]",
	  "create NAME from a .npy file and publish it; or every array\nof a checkpoint as "
	  "PREFIX+its name, in one commit (PREFIX ends\nin / . _ : or -; --force: replace "
	  "tensors you own)" },
	{ "get", cmd_get, 2, 2, 0, "get NAME OUT.npy | get PREFIX OUT.npz|OUT.safetensors",
	  "write a tensor to a .npy file (- for stdout); or every\ntensor under PREFIX, "
	  "from one commit, to one checkpoint" },
	{ "rm", cmd_rm, 1, INT_MAX, OPT_PREFIX | OPT_JSON,
	  "rm NAME... | rm --prefix PREFIX... [--json]",
	  "unlink the names (--prefix: every name under each\nPREFIX) in one commit: all or none" },
	{ "wait", cmd_wait, 1, 1, OPT_TIMEOUT | OPT_JSON, "wait NAME [--timeout SEC] [--json]",
	  "wait until NAME is published" },
	{ "watch", cmd_watch, 0, 1, OPT_AFTER | OPT_QUEUE | OPT_JSON | OPT_GROUP,
	  "watch [PREFIX] [--after COMMIT] [--queue N] [--group prefix|commit] [--json]",
	  "print a line per publish and unlink under PREFIX until\ninterrupted (--after: first "
	  "the names committed since;\n--group: a line per commit, or per commit and prefix)" },
	{ "stats", cmd_stats, 0, 0, OPT_JSON | OPT_PROMETHEUS | OPT_RAW,
	  "stats [--raw|--json|--prometheus]",
	  "daemon totals, per device and uid (--raw: every figure;\n--prometheus: the metrics "
	  "text)" },
	{ "leases", cmd_leases, 0, 1, OPT_JSON | OPT_GROUP,
	  "leases [NAME] [--group prefix|commit] [--json]",
	  "who holds leases: pid, user, command, label, count,\nsince (--group: a row per holder "
	  "and prefix or commit)" },
	{ "clients", cmd_clients, 0, 0, OPT_JSON, "clients [--json]",
	  "client connections, with their labels (root: all;\nothers: their own)" },
	{ "peers", cmd_peers, 0, 0, OPT_JSON, "peers [--json]",
	  "other nodes' daemons this one peers with: state, last\nerror, traffic (root and the "
	  "daemon's uid only)" },
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

/* --help: every command's usage line and what it does, from the table. */
static void print_help(FILE *f)
{
	fputs("usage: tensorctl [--socket PATH] COMMAND [ARGS] [OPTIONS]\n\n", f);
	for (size_t i = 0; i < N_COMMANDS; i++) {
		const char *h = commands[i].help, *nl;
		int w = (int)strlen(commands[i].usage);

		/* The help in a column; a long usage line gets it on the next line. */
		fprintf(f, "  %s", commands[i].usage);
		for (bool first = true; *h; first = false, h = nl ? nl + 1 : h + strlen(h)) {
			nl = strchr(h, '\n');
			if (!first || w > 32)
				fprintf(f, "\n%35s", "");
			else
				fprintf(f, "%*s", 33 - w, "");
			fprintf(f, "%.*s", nl ? (int)(nl - h) : (int)strlen(h), h);
		}
		fputc('\n', f);
	}
	fputs(usage_tail, f);
}

/* The options; bit 0 (--socket) is accepted by every command. */
static const struct {
	const char *name;
	unsigned bit;
	bool has_value;
} options[] = {
	{ "--socket", 0, true },
	{ "--json", OPT_JSON, false },
	{ "--mutable", OPT_MUTABLE, false },
	{ "--mode", OPT_MODE, true },
	{ "--lifetime", OPT_LIFETIME, true },
	{ "--timeout", OPT_TIMEOUT, true },
	{ "--prometheus", OPT_PROMETHEUS, false },
	{ "--force", OPT_FORCE, false },
	{ "--after", OPT_AFTER, true },
	{ "--queue", OPT_QUEUE, true },
	{ "--prefix", OPT_PREFIX, false },
	{ "--group", OPT_GROUP, true },
	{ "--raw", OPT_RAW, false },
};

#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

/* Stores one option's value in a; NULL, or why the value is wrong. */
static const char *set_option(struct args *a, unsigned bit, const char *val)
{
	unsigned long long ull;
	unsigned long v;
	char *end;
	double d;

	switch (bit) {
	case 0:
		a->socket = val;
		return *val ? NULL : "--socket needs a path";
	case OPT_JSON:
	case OPT_PROMETHEUS:
	case OPT_PREFIX:
	case OPT_RAW:
		return NULL;
	case OPT_GROUP:
		if (strcmp(val, "prefix") == 0)
			a->group = GROUP_PREFIX;
		else if (strcmp(val, "commit") == 0)
			a->group = GROUP_COMMIT;
		else
			return "--group takes prefix or commit";
		return NULL;
	case OPT_MUTABLE:
		a->flags |= TENSORD_MUTABLE;
		return NULL;
	case OPT_FORCE:
		a->flags |= TENSORD_REPLACE;
		return NULL;
	case OPT_MODE:
		errno = 0;
		v = strtoul(val, &end, 8);
		a->mode = (uint32_t)v;
		return end == val || *end || errno || v > 0777 || val[0] == '-'
			       ? "--mode takes an octal mode such as 0640"
			       : NULL;
	case OPT_AFTER:
	case OPT_QUEUE:
		errno = 0;
		ull = strtoull(val, &end, 10);
		if (end == val || *end || errno || val[0] == '-' ||
		    (bit == OPT_QUEUE && (ull < 1 || ull > 65536)))
			return bit == OPT_AFTER ? "--after takes a commit id (a number)"
						: "--queue takes a number of events, 1 to 65536";
		if (bit == OPT_AFTER)
			a->after = ull;
		else
			a->queue = (uint32_t)ull;
		return NULL;
	case OPT_LIFETIME:
		a->flags &= ~(uint32_t)TENSORD_LIFETIME_CONNECTION;
		if (strcmp(val, "connection") == 0)
			a->flags |= TENSORD_LIFETIME_CONNECTION;
		else if (strcmp(val, "persistent") != 0)
			return "--lifetime takes persistent or connection";
		return NULL;
	default:
		/* Fractional seconds or inf; rounded up so 0.0001 still waits. */
		d = strtod(val, &end);
		if (end == val || *end || !(d >= 0))
			return "--timeout takes a number of seconds (or inf)";
		a->timeout_ms = d * 1000 >= INT_MAX ? -1 : (int)(d * 1000 + 0.999);
		return NULL;
	}
}

/*
 * One positional argument: the command itself when none was named yet,
 * else the command's next argument. 0, or EXIT_USAGE after a usage error.
 */
static int take_positional(struct args *a, const char *arg, const struct command **cmd)
{
	char q[QUOTE_MAX];
	size_t o;

	if (!*cmd) {
		for (o = 0; o < N_COMMANDS && strcmp(commands[o].name, arg); o++)
			;
		if (o == N_COMMANDS)
			return usage_error(NULL, "unknown command %s",
					   quote(arg, QUOTE_MSG, q, sizeof(q)));
		*cmd = &commands[o];
	} else if (a->npos == (*cmd)->max_pos) {
		return usage_error((*cmd)->usage, "%s: unexpected argument %s", (*cmd)->name,
				   quote(arg, QUOTE_MSG, q, sizeof(q)));
	} else {
		a->pos[a->npos++] = arg;
	}
	return 0;
}

/*
 * The option argv[*i], as "--opt", "--opt=VALUE" or "--opt VALUE" (which
 * consumes argv[*i + 1] and advances *i). 0, or EXIT_USAGE after a usage
 * error; use is the usage line for that error.
 */
static int take_option(int argc, char **argv, int *i, struct args *a, const char *use)
{
	const char *arg = argv[*i], *eq = strchr(arg, '='), *val = NULL, *why;
	size_t o, n = eq ? (size_t)(eq - arg) : strlen(arg);
	char q[QUOTE_MAX];

	for (o = 0; o < N_OPTIONS; o++)
		if (strlen(options[o].name) == n && strncmp(arg, options[o].name, n) == 0)
			break;
	if (o == N_OPTIONS)
		return usage_error(use, "unknown option %s", quote(arg, QUOTE_MSG, q, sizeof(q)));
	if (!options[o].has_value && eq)
		return usage_error(use, "%s takes no value", options[o].name);
	if (options[o].has_value) {
		if (eq)
			val = eq + 1;
		else if (*i + 1 < argc)
			val = argv[++*i];
		else
			return usage_error(use, "%s needs a value", options[o].name);
	}
	why = set_option(a, options[o].bit, val);
	if (why)
		return usage_error(use, "%s", why);
	a->seen |= options[o].bit;
	return 0;
}

/*
 * Splits argv: options may come before the command or anywhere after it,
 * as "--opt VALUE" or "--opt=VALUE"; "--" ends them. Returns 0 with
 * *ret_cmd set, 0 with *ret_cmd NULL when help or the version was printed,
 * or 2 after a usage error.
 */
static int parse_args(int argc, char **argv, struct args *a, const struct command **ret_cmd)
{
	const struct command *cmd = NULL;
	bool only_pos = false;
	size_t o;
	int i, rc;

	*ret_cmd = NULL;
	for (i = 1; i < argc; i++) {
		const char *arg = argv[i];

		if (only_pos || arg[0] != '-' || strcmp(arg, "-") == 0) {
			rc = take_positional(a, arg, &cmd);
		} else if (strcmp(arg, "--") == 0) {
			only_pos = true;
			continue;
		} else if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
			if (cmd)
				printf("usage: tensorctl [--socket PATH] %s\n", cmd->usage);
			else
				print_help(stdout);
			return 0;
		} else if (strcmp(arg, "--version") == 0) {
			printf("tensorctl %s (protocol %d)\n", TENSORD_VERSION,
			       TENSORD_PROTOCOL_VERSION);
			return 0;
		} else {
			rc = take_option(argc, argv, &i, a, cmd ? cmd->usage : NULL);
		}
		if (rc)
			return rc;
	}

	if (!cmd)
		return usage_error(NULL, "no command given");
	for (o = 0; o < N_OPTIONS; o++)
		if (a->seen & ~cmd->opts & options[o].bit)
			return usage_error(cmd->usage, "%s does not take %s", cmd->name,
					   options[o].name);
	if (a->npos < cmd->min_pos)
		return usage_error(cmd->usage, "%s: missing arguments", cmd->name);
	if (cmd->run == cmd_put && (a->seen & OPT_JSON) && !is_checkpoint(a->pos[1]))
		return usage_error(cmd->usage, "put: --json is for .npz and .safetensors files");
	*ret_cmd = cmd;
	return 0;
}

/* Reports a failed connect to socket (NULL: the default path); the exit status. */
static int connect_failed(int rc, const char *socket)
{
	char path[256], msg[768];

	if (!socket && tensord_default_socket_path(path, sizeof(path)) == 0)
		socket = path;
	/* The library's message names the paths it tried and the fix. */
	if (*tensord_last_error())
		return report(rc, tensord_last_error(), NULL);
	snprintf(msg, sizeof(msg), "cannot connect to %s: %s", socket ? socket : "tensord",
		 errmsg(rc));
	return report(rc, msg, NULL);
}

/* Connects and runs cmd; the exit status. */
static int run(const struct command *cmd, struct args *a)
{
	tensord_client *c;
	int rc;

	report_as_json(a->seen & OPT_JSON);
	if (cmd->run == cmd_watch && watch_block_signals() < 0)
		return report(-errno, strerror(errno), NULL);
	rc = tensord_connect(a->socket, &c);
	if (rc < 0)
		return connect_failed(rc, a->socket);
	rc = cmd->run(c, a);
	tensord_close(c);
	return rc;
}

int main(int argc, char **argv)
{
	struct args a = { .timeout_ms = -1 };
	const struct command *cmd;
	int rc;

	a.pos = calloc((size_t)argc, sizeof(*a.pos));
	if (!a.pos)
		return report(-ENOMEM, "out of memory", NULL);
	rc = parse_args(argc, argv, &a, &cmd);
	if (rc == 0 && cmd)
		rc = run(cmd, &a);
	free(a.pos);
	return rc;
}
