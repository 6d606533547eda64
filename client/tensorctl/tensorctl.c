/*
 * tensorctl: the command-line client of tensord (CONTRACT.md §7).
 *
 * It uses only the public libtensord API. Exit status: 0 on success, 1 when
 * an operation fails (the reason on stderr), 2 on a usage error. Read
 * commands print aligned tables for people and, with --json, one JSON value
 * for programs. docs/tensorctl.md describes both formats.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <tensord/tensord.h>

#include "npy.h"

#ifndef TENSORD_VERSION
#define TENSORD_VERSION "0.1.0"
#endif

#define EXIT_OP 1
#define EXIT_USAGE 2

static const char usage_text[] =
	"usage: tensorctl [--socket PATH] COMMAND [ARGS] [OPTIONS]\n\n"
	"  ls [PREFIX] [--json]             list tensors whose name starts with PREFIX\n"
	"  stat NAME [--json]               describe one tensor\n"
	"  put NAME FILE.npy [--mutable] [--mode MODE] [--lifetime persistent|connection]\n"
	"                                   create NAME from a .npy file and publish it\n"
	"  get NAME OUT.npy                 write a tensor to a .npy file (- for stdout)\n"
	"  rm NAME                          unlink a tensor\n"
	"  wait NAME [--timeout SEC] [--json]  wait until NAME is published\n"
	"  stats [--json]                   daemon totals, per device\n"
	"--socket PATH (else $TENSORD_SOCKET, else the default path) picks the daemon;\n"
	"-h/--help, --version. Options may come before or after the arguments.\n"
	"exit status: 0 success, 1 operation error, 2 usage error\n";

/* Options, as bits, so each command can say which it takes. */
enum { OPT_JSON = 1, OPT_MUTABLE = 2, OPT_MODE = 4, OPT_LIFETIME = 8, OPT_TIMEOUT = 16 };

struct args {
	const char *socket;     /* borrowed from argv; NULL: the library's default */
	const char *pos[3];     /* positionals after the command, borrowed from argv */
	int npos;
	unsigned seen;          /* OPT_* given */
	uint32_t flags;         /* TENSORD_MUTABLE | TENSORD_LIFETIME_CONNECTION */
	uint32_t mode;
	int timeout_ms;         /* -1: forever */
};

struct command {
	const char *name;
	int (*run)(tensord_client *c, const struct args *a);
	int min_pos, max_pos;
	unsigned opts;
	const char *usage;
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

/*
 * Reports a failed call: the library's message for it, else strerror. The
 * message is made to name the tensor when there is one, so a user running
 * several commands in a script can tell which failed.
 */
static int report(const char *msg, const char *name)
{
	if (name && !strstr(msg, name))
		fprintf(stderr, "tensorctl: tensor '%s': %s\n", name, msg);
	else
		fprintf(stderr, "tensorctl: %s\n", msg);
	return EXIT_OP;
}

/* The daemon's or library's message for the failed call, else strerror. */
static const char *errmsg(int rc)
{
	return *tensord_last_error() ? tensord_last_error() : tensord_strerror(rc);
}

static int op_error(int rc, const char *name)
{
	return report(errmsg(rc), name);
}

/* "1.5 KiB": binary units, one decimal above bytes. */
static const char *human(uint64_t b, char *buf, size_t len)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double v = (double)b;
	int u = -1;

	for (; v >= 1024 && u < 5; u++)
		v /= 1024;
	if (u < 0)
		snprintf(buf, len, "%" PRIu64 " B", b);
	else
		snprintf(buf, len, "%.1f %s", v, units[u]);
	return buf;
}

/* Longest ints() text: 32 dimensions of up to 20 characters and separators. */
#define INTS_MAX (TENSORD_NDIM_MAX * 22 + 4)

/*
 * Shapes and strides: "[3, 4]" for JSON; numpy's tuple "(3,4)", "(5,)", "()"
 * without spaces for tables, so columns split on whitespace.
 */
static const char *ints(const int64_t *v, int32_t n, bool json, char *buf, size_t len)
{
	size_t off = (size_t)snprintf(buf, len, json ? "[" : "(");
	int32_t i;

	for (i = 0; i < n && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s%" PRId64,
					i == 0 ? "" : json ? ", " : ",", v[i]);
	if (off < len)
		snprintf(buf + off, len - off, json ? "]" : n == 1 ? ",)" : ")");
	return buf;
}

static const char *state_name(tensord_state s)
{
	static const char *const names[] = { "unknown", "created", "published", "unlinked" };

	return names[(unsigned)s < 4 ? s : 0];
}

static const char *owner_name(uint32_t uid, char *buf, size_t len)
{
	struct passwd *pw = getpwuid(uid);

	if (pw)
		snprintf(buf, len, "%s", pw->pw_name);
	else
		snprintf(buf, len, "%" PRIu32, uid);
	return buf;
}

/* Writes s as a JSON string. Names are plain ASCII, but backends and paths come from the daemon. */
static void json_str(const char *s)
{
	const unsigned char *p;

	putchar('"');
	for (p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p < 0x20 || *p == 0x7f)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}

/* ", \"key\": \"value\"" with the value escaped; no comma when first. */
static void json_field(const char *key, const char *val, bool first)
{
	printf("%s\"%s\": ", first ? "" : ", ", key);
	json_str(val);
}

/* created_ns as "2024-05-01T12:34:56.123456789Z", in JSON and in stat alike. */
static const char *iso_time(uint64_t ns, char *buf, size_t len)
{
	time_t secs = (time_t)(ns / 1000000000u);
	struct tm tm;
	size_t n;

	n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", gmtime_r(&secs, &tm));
	snprintf(buf + n, len - n, ".%09" PRIu64 "Z", ns % 1000000000u);
	return buf;
}

/* One tensor as a JSON object, followed by end. */
static void json_info(const tensord_info *in, const char *end)
{
	char dt[48], dev[32], t[48], sh[INTS_MAX], st[INTS_MAX];

	putchar('{');
	json_field("name", in->name, true);
	json_field("dtype", tensord_dtype_name(in->dtype, dt, sizeof(dt)), false);
	printf(", \"shape\": %s, \"strides\": %s", ints(in->shape, in->ndim, true, sh, sizeof(sh)),
	       ints(in->strides, in->ndim, true, st, sizeof(st)));
	json_field("device", tensord_device_name(in->device, dev, sizeof(dev)), false);
	printf(", \"nbytes\": %" PRIu64 ", \"byte_offset\": %" PRIu64
	       ", \"state\": \"%s\", \"refcount\": %" PRIu32 ", \"owner_uid\": %" PRIu32
	       ", \"owner_gid\": %" PRIu32 ", \"mode\": \"%04o\", \"mutable\": %s"
	       ", \"lifetime\": \"%s\", \"created_ns\": %" PRIu64 ", \"created\": \"%s\""
	       ", \"id\": %" PRIu64 "}%s",
	       in->nbytes, in->byte_offset, state_name(in->state), in->refcount, in->owner_uid,
	       in->owner_gid, (unsigned)(in->mode & 07777),
	       in->flags & TENSORD_MUTABLE ? "true" : "false",
	       in->flags & TENSORD_LIFETIME_CONNECTION ? "connection" : "persistent",
	       in->created_ns, iso_time(in->created_ns, t, sizeof(t)), in->id, end);
}

/* Flushes stdout; a failed write (a full disk, a closed pipe) is an operation error. */
static int finish_output(void)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "tensorctl: write error: %s\n", strerror(errno));
		return EXIT_OP;
	}
	return 0;
}

enum { COL_NAME, COL_DTYPE, COL_SHAPE, COL_DEVICE, COL_BYTES, COL_STATE, COL_REFS, COL_OWNER,
       NCOL };

static const char *const col_title[NCOL] = { "NAME", "DTYPE", "SHAPE", "DEVICE",
					     "BYTES", "STATE", "REFS", "OWNER" };

/* The text of one table cell, in buf or static. */
static const char *ls_cell(const tensord_info *in, int col, char *buf, size_t len)
{
	switch (col) {
	case COL_NAME:
		return in->name;
	case COL_DTYPE:
		return tensord_dtype_name(in->dtype, buf, len);
	case COL_SHAPE:
		return ints(in->shape, in->ndim, false, buf, len);
	case COL_DEVICE:
		return tensord_device_name(in->device, buf, len);
	case COL_BYTES:
		return human(in->nbytes, buf, len);
	case COL_STATE:
		return state_name(in->state);
	case COL_REFS:
		snprintf(buf, len, "%" PRIu32, in->refcount);
		return buf;
	default:
		return owner_name(in->owner_uid, buf, len);
	}
}

static int cmd_ls(tensord_client *c, const struct args *a)
{
	char buf[INTS_MAX];
	tensord_info *infos = NULL;
	size_t n = 0, i, w[NCOL];
	const char *cell;
	int rc, k;

	rc = tensord_list(c, a->npos ? a->pos[0] : NULL, &infos, &n);
	if (rc < 0)
		return op_error(rc, NULL);
	if (a->seen & OPT_JSON) {
		putchar('[');
		for (i = 0; i < n; i++)
			json_info(&infos[i], i + 1 < n ? ",\n " : "");
		puts("]");
		goto out;
	}

	/* Two passes: column widths first, then the rows. */
	for (k = 0; k < NCOL; k++)
		w[k] = strlen(col_title[k]);
	for (i = 0; i < n; i++)
		for (k = 0; k < NCOL; k++)
			if ((cell = ls_cell(&infos[i], k, buf, sizeof(buf))) && strlen(cell) > w[k])
				w[k] = strlen(cell);
	/* Numbers align right, text left; the last column is not padded. */
	for (i = 0; i <= n; i++) {
		for (k = 0; k < NCOL; k++) {
			cell = i ? ls_cell(&infos[i - 1], k, buf, sizeof(buf)) : col_title[k];
			if (k == NCOL - 1)
				printf("%s\n", cell);
			else
				printf(k == COL_BYTES || k == COL_REFS ? "%*s  " : "%-*s  ",
				       (int)w[k], cell);
		}
	}
out:
	free(infos);
	return finish_output();
}

static void print_info(const tensord_info *in)
{
	char b1[INTS_MAX], b2[64];

	printf("name:     %s\n", in->name);
	printf("dtype:    %s\n", tensord_dtype_name(in->dtype, b2, sizeof(b2)));
	printf("shape:    %s\n", ints(in->shape, in->ndim, false, b1, sizeof(b1)));
	printf("strides:  %s\n", ints(in->strides, in->ndim, false, b1, sizeof(b1)));
	printf("device:   %s\n", tensord_device_name(in->device, b2, sizeof(b2)));
	printf("bytes:    %" PRIu64 " (%s)\n", in->nbytes, human(in->nbytes, b2, sizeof(b2)));
	printf("state:    %s\n", state_name(in->state));
	printf("refs:     %" PRIu32 "\n", in->refcount);
	printf("owner:    %s (uid %" PRIu32 ", gid %" PRIu32 ")\n",
	       owner_name(in->owner_uid, b2, sizeof(b2)), in->owner_uid, in->owner_gid);
	printf("mode:     %04o\n", (unsigned)(in->mode & 07777));
	printf("flags:    %s, %s\n", in->flags & TENSORD_MUTABLE ? "mutable" : "immutable",
	       in->flags & TENSORD_LIFETIME_CONNECTION ? "connection lifetime" : "persistent");
	printf("created:  %s\n", iso_time(in->created_ns, b2, sizeof(b2)));
	printf("id:       %" PRIu64 "\n", in->id);
}

static int cmd_stat(tensord_client *c, const struct args *a)
{
	tensord_info info;
	int rc;

	rc = tensord_stat(c, a->pos[0], &info);
	if (rc < 0)
		return op_error(rc, a->pos[0]);
	if (a->seen & OPT_JSON)
		json_info(&info, "\n");
	else
		print_info(&info);
	return finish_output();
}

static int cmd_stats(tensord_client *c, const struct args *a)
{
	char dev[32], used[32], cap[32], pct[16];
	uint64_t up;
	tensord_daemon_stats st;
	uint32_t i;
	int rc;

	rc = tensord_stats(c, &st, sizeof(st));
	if (rc < 0)
		return op_error(rc, NULL);
	if (st.n_devices > TENSORD_STATS_DEVICES_MAX)
		st.n_devices = TENSORD_STATS_DEVICES_MAX;
	if (a->seen & OPT_JSON) {
		printf("{\"tensors\": %" PRIu64 ", \"clients\": %" PRIu64 ", \"leases\": %" PRIu64
		       ", \"uptime_ns\": %" PRIu64 ", \"daemon_pid\": %" PRIu32 ", \"devices\": [",
		       st.tensors, st.clients, st.leases, st.uptime_ns, st.daemon_pid);
		for (i = 0; i < st.n_devices; i++) {
			const tensord_device_stats *d = &st.devices[i];

			printf("%s{", i ? ", " : "");
			tensord_device_name(d->device, dev, sizeof(dev));
			json_field("device", dev, true);
			json_field("backend", d->backend, false);
			json_field("path", d->path, false);
			printf(", \"bytes_used\": %" PRIu64 ", \"bytes_capacity\": %" PRIu64
			       ", \"tensors\": %" PRIu32 "}",
			       d->bytes_used, d->bytes_capacity, d->tensors);
		}
		puts("]}");
		return finish_output();
	}

	up = st.uptime_ns / 1000000000u;
	printf("tensors:  %" PRIu64 "\nclients:  %" PRIu64 "\nleases:   %" PRIu64
	       "\nuptime:   %" PRIu64 "d %02" PRIu64 "h %02" PRIu64 "m %02" PRIu64
	       "s\npid:      %" PRIu32 "\n",
	       st.tensors, st.clients, st.leases, up / 86400, up / 3600 % 24, up / 60 % 60,
	       up % 60, st.daemon_pid);
	printf("\n%-8s  %-7s  %-8s  %7s  %10s  %10s  %6s\n", "DEVICE", "BACKEND", "PATH", "TENSORS",
	       "USED", "CAPACITY", "USE");
	for (i = 0; i < st.n_devices; i++) {
		const tensord_device_stats *d = &st.devices[i];
		double cap_d = (double)d->bytes_capacity;

		snprintf(pct, sizeof(pct), cap_d > 0 ? "%.1f%%" : "-",
			 cap_d > 0 ? 100.0 * (double)d->bytes_used / cap_d : 0.0);
		printf("%-8s  %-7.16s  %-8.16s  %7" PRIu32 "  %10s  %10s  %6s\n",
		       tensord_device_name(d->device, dev, sizeof(dev)), d->backend, d->path,
		       d->tensors, human(d->bytes_used, used, sizeof(used)),
		       human(d->bytes_capacity, cap, sizeof(cap)), pct);
	}
	return finish_output();
}

static int cmd_put(tensord_client *c, const struct args *a)
{
	const char *name = a->pos[0], *path = a->pos[1];
	int64_t strides[TENSORD_NDIM_MAX];
	DLManagedTensorVersioned *t;
	char err[256], saved[512];
	struct npy_map m;
	tensord_spec spec;
	int fd, rc;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		snprintf(err, sizeof(err), "%s", strerror(errno));
	rc = fd < 0 ? -1 : npy_map_fd(fd, &m, err, sizeof(err));
	if (fd >= 0)
		close(fd);
	if (rc < 0) {
		fprintf(stderr, "tensorctl: %s: %s\n", path, err);
		return EXIT_OP;
	}

	spec = (tensord_spec){ .dtype = m.hdr.dtype, .ndim = m.hdr.ndim,
			       .shape = m.hdr.ndim ? m.hdr.shape : NULL, .device = { kDLCPU, 0 },
			       .flags = a->flags, .mode = a->mode };
	/* A Fortran-order file keeps its layout, as column-major strides: still one copy. */
	if (m.hdr.fortran_order && m.hdr.ndim > 1 && m.hdr.count > 0) {
		npy_header_strides(&m.hdr, strides);
		spec.strides = strides;
	}

	rc = tensord_create(c, name, &spec, &t);
	if (rc < 0) {
		npy_unmap(&m);
		return op_error(rc, name);
	}
	if (m.hdr.data_bytes)
		memcpy((char *)t->dl_tensor.data + t->dl_tensor.byte_offset, m.data,
		       (size_t)m.hdr.data_bytes);
	npy_unmap(&m);
	rc = tensord_publish(c, name);
	t->deleter(t);
	if (rc < 0) {
		/* Keep the reason, then drop the half-made tensor so a retry can reuse the name. */
		snprintf(saved, sizeof(saved), "%s", errmsg(rc));
		tensord_unlink(c, name);
		return report(saved, name);
	}
	return 0;
}

/* Writes t to path ("-": stdout) via a temporary file renamed into place: no half files. */
static int write_npy_file(const DLTensor *t, const char *name, const char *path)
{
	char err[256] = "", tmp[PATH_MAX];
	mode_t mask = umask(0);
	FILE *f = NULL;
	int fd = -1, rc;

	umask(mask);
	if (strcmp(path, "-") == 0)
		f = stdout;
	else if (snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path) >= (int)sizeof(tmp))
		errno = ENAMETOOLONG;
	else if ((fd = mkostemp(tmp, O_CLOEXEC)) >= 0 && !(f = fdopen(fd, "wb")))
		close(fd);
	if (!f) {
		fprintf(stderr, "tensorctl: %s: %s\n", path, strerror(errno));
		if (fd >= 0)
			unlink(tmp);
		return EXIT_OP;
	}
	/* mkstemp makes 0600; give the file the mode numpy's open() would. */
	if (fd >= 0)
		fchmod(fd, 0666 & ~mask);
	rc = npy_write(f, t, err, sizeof(err));
	if ((f == stdout ? fflush(f) : fclose(f)) != 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && fd >= 0 && rename(tmp, path) < 0)
		rc = -errno;
	if (rc < 0 && fd >= 0)
		unlink(tmp);
	/* A dtype or device refusal is about the tensor; anything else is about the file. */
	if (rc == -ENOTSUP)
		fprintf(stderr, "tensorctl: tensor '%s': %s\n", name, err);
	else if (rc < 0)
		fprintf(stderr, "tensorctl: %s: %s\n", path, *err ? err : strerror(-rc));
	return rc < 0 ? EXIT_OP : 0;
}

static int cmd_get(tensord_client *c, const struct args *a)
{
	DLManagedTensorVersioned *t;
	int rc;

	rc = tensord_attach(c, a->pos[0], 0, &t);
	if (rc < 0)
		return op_error(rc, a->pos[0]);
	rc = write_npy_file(&t->dl_tensor, a->pos[0], a->pos[1]);
	t->deleter(t);
	return rc;
}

static int cmd_rm(tensord_client *c, const struct args *a)
{
	int rc = tensord_unlink(c, a->pos[0]);

	return rc < 0 ? op_error(rc, a->pos[0]) : 0;
}

static int cmd_wait(tensord_client *c, const struct args *a)
{
	DLManagedTensorVersioned *t;
	tensord_info info;
	int rc;

	rc = tensord_attach(c, a->pos[0], a->timeout_ms, &t);
	if (rc < 0)
		return op_error(rc, a->pos[0]);
	rc = (a->seen & OPT_JSON) ? tensord_tensor_info(t, &info) : 0;
	t->deleter(t);
	if (rc < 0)
		return op_error(rc, a->pos[0]);
	if (!(a->seen & OPT_JSON))
		return 0;
	json_info(&info, "\n");
	return finish_output();
}

static const struct command commands[] = {
	{ "ls", cmd_ls, 0, 1, OPT_JSON, "ls [PREFIX] [--json]" },
	{ "stat", cmd_stat, 1, 1, OPT_JSON, "stat NAME [--json]" },
	{ "put", cmd_put, 2, 2, OPT_MUTABLE | OPT_MODE | OPT_LIFETIME,
	  "put NAME FILE.npy [--mutable] [--mode MODE] [--lifetime persistent|connection]" },
	{ "get", cmd_get, 2, 2, 0, "get NAME OUT.npy" },
	{ "rm", cmd_rm, 1, 1, 0, "rm NAME" },
	{ "wait", cmd_wait, 1, 1, OPT_TIMEOUT | OPT_JSON, "wait NAME [--timeout SEC] [--json]" },
	{ "stats", cmd_stats, 0, 0, OPT_JSON, "stats [--json]" },
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

/* The options; bit 0 (--socket) is accepted by every command. */
static const struct {
	const char *name;
	unsigned bit;
	bool has_value;
} options[] = {
	{ "--socket", 0, true }, { "--json", OPT_JSON, false },
	{ "--mutable", OPT_MUTABLE, false }, { "--mode", OPT_MODE, true },
	{ "--lifetime", OPT_LIFETIME, true }, { "--timeout", OPT_TIMEOUT, true },
};

#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

/* Stores one option's value in a; NULL, or why the value is wrong. */
static const char *set_option(struct args *a, unsigned bit, const char *val)
{
	unsigned long v;
	char *end;
	double d;

	switch (bit) {
	case 0:
		a->socket = val;
		return *val ? NULL : "--socket needs a path";
	case OPT_JSON:
		return NULL;
	case OPT_MUTABLE:
		a->flags |= TENSORD_MUTABLE;
		return NULL;
	case OPT_MODE:
		errno = 0;
		v = strtoul(val, &end, 8);
		a->mode = (uint32_t)v;
		return end == val || *end || errno || v > 0777 || val[0] == '-'
			       ? "--mode takes an octal mode such as 0640"
			       : NULL;
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
 * Splits argv: options may come before the command or anywhere after it,
 * as "--opt VALUE" or "--opt=VALUE"; "--" ends them. Returns 0 with
 * *ret_cmd set, 0 with *ret_cmd NULL when help or the version was printed,
 * or 2 after a usage error.
 */
static int parse_args(int argc, char **argv, struct args *a, const struct command **ret_cmd)
{
	const struct command *cmd = NULL;
	bool only_pos = false;
	const char *why;
	size_t o, n;
	int i;

	*ret_cmd = NULL;
	for (i = 1; i < argc; i++) {
		const char *arg = argv[i], *eq = strchr(arg, '='), *val = NULL;
		const char *use = cmd ? cmd->usage : NULL;

		if (only_pos || arg[0] != '-' || strcmp(arg, "-") == 0) {
			if (!cmd) {
				for (o = 0; o < N_COMMANDS && strcmp(commands[o].name, arg); o++)
					;
				if (o == N_COMMANDS)
					return usage_error(NULL, "unknown command '%s'", arg);
				cmd = &commands[o];
			} else if (a->npos == cmd->max_pos)
				return usage_error(use, "%s: unexpected argument '%s'", cmd->name,
						   arg);
			else
				a->pos[a->npos++] = arg;
			continue;
		}
		if (strcmp(arg, "--") == 0) {
			only_pos = true;
			continue;
		}
		if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
			if (cmd)
				printf("usage: tensorctl [--socket PATH] %s\n", cmd->usage);
			else
				fputs(usage_text, stdout);
			return 0;
		}
		if (strcmp(arg, "--version") == 0) {
			printf("tensorctl %s (protocol %d)\n", TENSORD_VERSION,
			       TENSORD_PROTOCOL_VERSION);
			return 0;
		}

		n = eq ? (size_t)(eq - arg) : strlen(arg);
		for (o = 0; o < N_OPTIONS; o++)
			if (strlen(options[o].name) == n && strncmp(arg, options[o].name, n) == 0)
				break;
		if (o == N_OPTIONS)
			return usage_error(use, "unknown option '%s'", arg);
		if (!options[o].has_value && eq)
			return usage_error(use, "%s takes no value", options[o].name);
		if (options[o].has_value) {
			if (eq)
				val = eq + 1;
			else if (i + 1 < argc)
				val = argv[++i];
			else
				return usage_error(use, "%s needs a value", options[o].name);
		}
		why = set_option(a, options[o].bit, val);
		if (why)
			return usage_error(use, "%s", why);
		a->seen |= options[o].bit;
	}

	if (!cmd)
		return usage_error(NULL, "no command given");
	for (o = 0; o < N_OPTIONS; o++)
		if (a->seen & ~cmd->opts & options[o].bit)
			return usage_error(cmd->usage, "%s does not take %s", cmd->name,
					   options[o].name);
	if (a->npos < cmd->min_pos)
		return usage_error(cmd->usage, "%s: missing arguments", cmd->name);
	*ret_cmd = cmd;
	return 0;
}

int main(int argc, char **argv)
{
	struct args a = { .timeout_ms = -1 };
	const struct command *cmd;
	tensord_client *c;
	char path[256];
	int rc;

	rc = parse_args(argc, argv, &a, &cmd);
	if (rc || !cmd)
		return rc;

	rc = tensord_connect(a.socket, &c);
	if (rc < 0) {
		/* The library's message usually names the path already. */
		if (!a.socket && tensord_default_socket_path(path, sizeof(path)) == 0)
			a.socket = path;
		if (a.socket && strstr(errmsg(rc), a.socket))
			fprintf(stderr, "tensorctl: %s\n", errmsg(rc));
		else
			fprintf(stderr, "tensorctl: cannot connect to %s: %s\n",
				a.socket ? a.socket : "tensord", errmsg(rc));
		return EXIT_OP;
	}
	rc = cmd->run(c, &a);
	tensord_close(c);
	return rc;
}
