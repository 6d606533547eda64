/*
 * Everything tensorctl prints. Read commands print aligned tables for
 * people and, with --json, one JSON value for programs; docs/tensorctl.md
 * describes both formats, so a change here is a change of interface.
 * Failures go to stderr, one line each, naming the tensor.
 */
#include <errno.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tensorctl.h"

/* --- failure reports ------------------------------------------------------------ */

static bool json_errors;

void report_as_json(bool on)
{
	json_errors = on;
}

static void json_str_to(FILE *f, const char *s);

/*
 * The message is made to name the tensor when there is one, so a user
 * running several commands in a script can tell which failed.
 */
int report(int rc, const char *msg, const char *name)
{
	char line[1024];

	if (name && !strstr(msg, name))
		snprintf(line, sizeof(line), "tensor '%s': %s", name, msg);
	else
		snprintf(line, sizeof(line), "%s", msg);
	if (!json_errors) {
		fprintf(stderr, "tensorctl: %s\n", line);
	} else {
		fprintf(stderr,
			"{\"error\": \"%s\", \"errno\": %d, \"message\": ", tensord_err_name(rc),
			rc < 0 ? -rc : rc);
		json_str_to(stderr, line);
		fputs("}\n", stderr);
	}
	return rc == -ETIMEDOUT ? EXIT_TIMEOUT : EXIT_OP;
}

const char *errmsg(int rc)
{
	return *tensord_last_error() ? tensord_last_error() : tensord_strerror(rc);
}

int op_error(int rc, const char *name)
{
	return report(rc, errmsg(rc), name);
}

int finish_output(void)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "tensorctl: write error: %s\n", strerror(errno));
		return EXIT_OP;
	}
	return 0;
}

/* --- values -------------------------------------------------------------------- */

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
					i == 0 ? ""
					: json ? ", "
					       : ",",
					v[i]);
	if (off < len)
		snprintf(buf + off, len - off, json ? "]" : n == 1 ? ",)" : ")");
	return buf;
}

const char *state_name(tensord_state s)
{
	static const char *const names[] = { "unknown", "created", "published", "unlinked" };

	return names[(unsigned)s < 4 ? s : 0];
}

const char *owner_name(uint32_t uid, char *buf, size_t len)
{
	/* One lookup per run of the same owner: a listing of 100,000 tensors
	 * asked the password database 200,000 times (30 s). */
	static char last[64];
	static uint32_t last_uid;
	static bool have_last;
	struct passwd *pw;

	if (!have_last || last_uid != uid) {
		pw = getpwuid(uid);
		if (pw)
			snprintf(last, sizeof(last), "%s", pw->pw_name);
		else
			snprintf(last, sizeof(last), "%" PRIu32, uid);
		last_uid = uid;
		have_last = true;
	}
	snprintf(buf, len, "%s", last);
	return buf;
}

/* created_ns as "2024-05-01T12:34:56.123456789Z", in JSON and in stat alike. */
const char *iso_time(uint64_t ns, char *buf, size_t len)
{
	time_t secs = (time_t)(ns / 1000000000u);
	struct tm tm;
	size_t n;

	n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", gmtime_r(&secs, &tm));
	snprintf(buf + n, len - n, ".%09" PRIu64 "Z", ns % 1000000000u);
	return buf;
}

/* --- JSON ------------------------------------------------------------------------ */

/* Writes s as a JSON string to f. Names are plain ASCII, but backends and paths come from the daemon. */
static void json_str_to(FILE *f, const char *s)
{
	const unsigned char *p;

	fputc('"', f);
	for (p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20 || *p == 0x7f)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

void json_str(const char *s)
{
	json_str_to(stdout, s);
}

/* ", \"key\": \"value\"" with the value escaped; no comma when first. */
void json_field(const char *key, const char *val, bool first)
{
	printf("%s\"%s\": ", first ? "" : ", ", key);
	json_str(val);
}

void json_info(const tensord_info *in, const char *end)
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

void print_stats_json(const tensord_daemon_stats *st, const tensord_uid_stats *u, size_t n)
{
	char dev[32];
	uint32_t i;

	printf("{\"tensors\": %" PRIu64 ", \"clients\": %" PRIu64 ", \"leases\": %" PRIu64
	       ", \"uptime_ns\": %" PRIu64 ", \"daemon_pid\": %" PRIu32 ", \"devices\": [",
	       st->tensors, st->clients, st->leases, st->uptime_ns, st->daemon_pid);
	for (i = 0; i < st->n_devices; i++) {
		const tensord_device_stats *d = &st->devices[i];

		printf("%s{", i ? ", " : "");
		tensord_device_name(d->device, dev, sizeof(dev));
		json_field("device", dev, true);
		json_field("backend", d->backend, false);
		json_field("path", d->path, false);
		printf(", \"bytes_used\": %" PRIu64 ", \"bytes_capacity\": %" PRIu64
		       ", \"tensors\": %" PRIu32 ", \"gpu_bytes\": %" PRIu64 "}",
		       d->bytes_used, d->bytes_capacity, d->tensors, st->device_gpu_bytes[i]);
	}
	printf("], \"daemon_fds\": %" PRIu32 ", \"host_pool_fds\": %" PRIu32
	       ", \"host_pool_bytes\": %" PRIu64 ", \"host_pool_budget\": %" PRIu64
	       ", \"host_pool_hits\": %" PRIu64 ", \"host_pool_misses\": %" PRIu64
	       ", \"host_slabs\": %" PRIu32 ", \"host_slab_bytes\": %" PRIu64 ", \"uids\": [",
	       st->daemon_fds, st->host_pool_fds, st->host_pool_bytes, st->host_pool_budget,
	       st->host_pool_hits, st->host_pool_misses, st->host_slabs, st->host_slab_bytes);
	for (size_t k = 0; k < n; k++)
		printf("%s{\"uid\": %" PRIu32 ", \"clients\": %" PRIu32 ", \"tensors\": %" PRIu64
		       ", \"fds\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"waiters\": %" PRIu32
		       ", \"fds_in_flight\": %" PRIu32 "}",
		       k ? ", " : "", u[k].uid, u[k].clients, u[k].tensors, u[k].fds, u[k].bytes,
		       u[k].waiters, u[k].fds_in_flight);
	printf("]}\n");
}

/* --- text -------------------------------------------------------------------------- */

void print_info(const tensord_info *in)
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

enum {
	COL_NAME,
	COL_DTYPE,
	COL_SHAPE,
	COL_DEVICE,
	COL_BYTES,
	COL_STATE,
	COL_REFS,
	COL_OWNER,
	NCOL
};

static const char *const col_title[NCOL] = { "NAME",  "DTYPE", "SHAPE", "DEVICE",
					     "BYTES", "STATE", "REFS",  "OWNER" };

/* The text of one table cell, in buf or static. */
static const char *ls_cell(const void *rows, size_t row, int col, char *buf, size_t len)
{
	const tensord_info *in = (const tensord_info *)rows + row;

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

void print_table(const char *const *titles, int ncol, unsigned right, const void *rows, size_t n,
		 table_cell_fn *cell_of)
{
	char buf[INTS_MAX];
	size_t i, w[TABLE_COLS_MAX];
	const char *cell;
	int k;

	/* Two passes: column widths first, then the rows. */
	for (k = 0; k < ncol; k++)
		w[k] = strlen(titles[k]);
	for (i = 0; i < n; i++)
		for (k = 0; k < ncol; k++)
			if ((cell = cell_of(rows, i, k, buf, sizeof(buf))) && strlen(cell) > w[k])
				w[k] = strlen(cell);
	/* Numbers align right, text left; the last column is not padded. */
	for (i = 0; i <= n; i++) {
		for (k = 0; k < ncol; k++) {
			cell = i ? cell_of(rows, i - 1, k, buf, sizeof(buf)) : titles[k];
			if (k == ncol - 1)
				printf("%s\n", cell);
			else
				printf(right & (1u << k) ? "%*s  " : "%-*s  ", (int)w[k], cell);
		}
	}
}

void print_ls_table(const tensord_info *infos, size_t n)
{
	print_table(col_title, NCOL, 1u << COL_BYTES | 1u << COL_REFS, infos, n, ls_cell);
}

/* What each uid holds, one row per uid. */
static void print_uid_usage(const tensord_uid_stats *u, size_t n)
{
	char id[24], bytes[32];

	printf("\n%-10s  %7s  %7s  %8s  %10s  %7s  %9s\n", "USER", "CLIENTS", "TENSORS", "WITH FDS",
	       "BYTES", "WAITERS", "IN FLIGHT");
	for (size_t k = 0; k < n; k++) {
		snprintf(id, sizeof(id), "uid %" PRIu32, u[k].uid);
		printf("%-10s  %7" PRIu32 "  %7" PRIu64 "  %8" PRIu64 "  %10s  %7" PRIu32
		       "  %9" PRIu32 "\n",
		       id, u[k].clients, u[k].tensors, u[k].fds,
		       human(u[k].bytes, bytes, sizeof(bytes)), u[k].waiters, u[k].fds_in_flight);
	}
}

void print_stats_text(const tensord_daemon_stats *st, const tensord_uid_stats *u, size_t n)
{
	char dev[32], used[32], cap[32], pct[16];
	uint64_t up = st->uptime_ns / 1000000000u;
	uint32_t i;

	printf("tensors:  %" PRIu64 "\nclients:  %" PRIu64 "\nleases:   %" PRIu64
	       "\nuptime:   %" PRIu64 "d %02" PRIu64 "h %02" PRIu64 "m %02" PRIu64
	       "s\npid:      %" PRIu32 "\n",
	       st->tensors, st->clients, st->leases, up / 86400, up / 3600 % 24, up / 60 % 60,
	       up % 60, st->daemon_pid);
	printf("fds:      %" PRIu32 "\npool:     %s ready in %" PRIu32 " memfds of %s; %" PRIu64
	       " hits, %" PRIu64 " misses\n",
	       st->daemon_fds, human(st->host_pool_bytes, used, sizeof(used)), st->host_pool_fds,
	       human(st->host_pool_budget, cap, sizeof(cap)), st->host_pool_hits,
	       st->host_pool_misses);
	printf("slabs:    %" PRIu32 " holding %s\n", st->host_slabs,
	       human(st->host_slab_bytes, used, sizeof(used)));
	printf("\n%-8s  %-7s  %-8s  %7s  %10s  %10s  %6s  %10s\n", "DEVICE", "BACKEND", "PATH",
	       "TENSORS", "USED", "CAPACITY", "USE", "GPU MEMORY");
	for (i = 0; i < st->n_devices; i++) {
		const tensord_device_stats *d = &st->devices[i];
		double cap_d = (double)d->bytes_capacity;
		char gpu[32] = "-";

		snprintf(pct, sizeof(pct), cap_d > 0 ? "%.1f%%" : "-",
			 cap_d > 0 ? 100.0 * (double)d->bytes_used / cap_d : 0.0);
		/* With its context: what the GPU lost to the daemon (NVML). */
		if (st->device_gpu_bytes[i])
			human(st->device_gpu_bytes[i], gpu, sizeof(gpu));
		printf("%-8s  %-7.16s  %-8.16s  %7" PRIu32 "  %10s  %10s  %6s  %10s\n",
		       tensord_device_name(d->device, dev, sizeof(dev)), d->backend, d->path,
		       d->tensors, human(d->bytes_used, used, sizeof(used)),
		       human(d->bytes_capacity, cap, sizeof(cap)), pct, gpu);
	}
	print_uid_usage(u, n);
}
