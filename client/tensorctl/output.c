/*
 * Everything tensorctl prints. Read commands print aligned tables for
 * people and, with --json, one JSON value for programs; docs/tensorctl.md
 * describes both formats, so a change here is a change of interface.
 * Failures go to stderr, one line each, naming the tensor.
 *
 * Names come from argv and from the daemon, messages from the daemon and
 * the library (which may embed the names), process names from other
 * users: none of it reaches the terminal raw. quote() escapes what could
 * move the cursor, recolour or retitle the terminal, or reorder the line,
 * and json_str() does the same in JSON's own escapes.
 */
#include <errno.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tensorctl.h"

/* --- untrusted text ------------------------------------------------------------- */

/*
 * The length of the UTF-8 sequence at p (1 to 4 bytes, end excluded) with
 * its code point in *cp, or 0 when p does not start a valid one: a stray
 * continuation byte, a truncated sequence, an overlong form, a surrogate,
 * or a value over U+10FFFF.
 */
static size_t utf8_next(const unsigned char *p, const unsigned char *end, uint32_t *cp)
{
	static const uint32_t min[5] = { 0, 0, 0x80, 0x800, 0x10000 };
	size_t n, i;
	uint32_t c;

	if (p[0] < 0x80) {
		*cp = p[0];
		return 1;
	}
	if (p[0] >= 0xc2 && p[0] <= 0xdf)
		n = 2, c = p[0] & 0x1f;
	else if (p[0] >= 0xe0 && p[0] <= 0xef)
		n = 3, c = p[0] & 0x0f;
	else if (p[0] >= 0xf0 && p[0] <= 0xf4)
		n = 4, c = p[0] & 0x07;
	else
		return 0;
	if ((size_t)(end - p) < n)
		return 0;
	for (i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		c = c << 6 | (p[i] & 0x3f);
	}
	if (c < min[n] || (c >= 0xd800 && c <= 0xdfff) || c > 0x10ffff)
		return 0;
	*cp = c;
	return n;
}

/*
 * Characters a terminal acts on rather than shows: C0 and C1 controls,
 * DEL, the line and paragraph separators, and the bidirectional controls
 * that reorder what follows them (the "Trojan Source" characters).
 */
static bool cp_unsafe(uint32_t c)
{
	return c < 0x20 || (c >= 0x7f && c <= 0x9f) || c == 0x061c || c == 0x200e || c == 0x200f ||
	       (c >= 0x2028 && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

/* Where quote() writes: buf, len bytes; at full it stops at a character boundary. */
struct qout {
	char *buf;
	size_t len, off;
	bool full;
};

static void q_put(struct qout *o, const char *p, size_t n)
{
	/* Room is kept for "...", a closing quote and the NUL. */
	if (o->full || o->off + n + 5 > o->len) {
		o->full = true;
		return;
	}
	memcpy(o->buf + o->off, p, n);
	o->off += n;
}

/* The bytes of one character as C escapes: \n, \t, \r, else octal as git writes them. */
static void q_escape(struct qout *o, const unsigned char *p, size_t n)
{
	char e[4 * 4 + 1];
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		if (p[i] == '\n' || p[i] == '\t' || p[i] == '\r')
			k += (size_t)snprintf(e + k, sizeof(e) - k, "\\%c",
					      p[i] == '\n'   ? 'n'
					      : p[i] == '\t' ? 't'
							     : 'r');
		else
			k += (size_t)snprintf(e + k, sizeof(e) - k, "\\%03o", p[i]);
	}
	q_put(o, e, k);
}

/* Whether s prints as itself: valid UTF-8 without characters cp_unsafe() names. */
static bool text_clean(const char *s, bool for_name)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
	uint32_t c;
	size_t n;

	if (for_name && p == end)
		return false; /* an empty name is shown as "" */
	for (; p < end; p += n) {
		if (!(n = utf8_next(p, end, &c)) || cp_unsafe(c))
			return false;
		if (for_name && (c == '"' || c == '\\' || c == '\''))
			return false;
	}
	return true;
}

const char *quote(const char *s, enum quote_how how, char *buf, size_t len)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
	struct qout o = { buf, len, 0, false };
	bool name = how != QUOTE_TEXT;
	uint32_t c;
	size_t n;

	if (len < 8) {
		if (len)
			buf[0] = '\0';
		return buf;
	}
	if (text_clean(s, name)) {
		if (how != QUOTE_MSG)
			return s;
		snprintf(buf, len, "'%s'", s);
		if (strlen(s) + 3 > len)
			snprintf(buf + len - 6, 6, "...'");
		return buf;
	}
	if (name)
		q_put(&o, "\"", 1);
	for (; p < end && !o.full; p += n) {
		n = utf8_next(p, end, &c);
		if (!n)
			q_escape(&o, p, n = 1);
		else if (cp_unsafe(c))
			q_escape(&o, p, n);
		else if (name && (c == '"' || c == '\\'))
			q_put(&o, c == '"' ? "\\\"" : "\\\\", 2);
		else
			q_put(&o, (const char *)p, n);
	}
	if (o.full) {
		memcpy(buf + o.off, "...", 3);
		o.off += 3;
	}
	if (name)
		buf[o.off++] = '"';
	buf[o.off] = '\0';
	return buf;
}

/* Writes s to f through quote(); escaped text longer than QUOTE_MAX is cut with "...". */
static void fput_quoted(FILE *f, const char *s, enum quote_how how)
{
	char buf[QUOTE_MAX];

	fputs(quote(s, how, buf, sizeof(buf)), f);
}

/* --- failure reports ------------------------------------------------------------ */

static bool json_errors;

void report_as_json(bool on)
{
	json_errors = on;
}

static void json_chars_to(FILE *f, const char *s);

/*
 * The message is made to name the tensor when there is one, so a user
 * running several commands in a script can tell which failed. Both come
 * from outside (argv, the daemon): the text line escapes them, the JSON
 * object has JSON's escapes.
 */
int report(int rc, const char *msg, const char *name)
{
	bool prefix = name && !strstr(msg, name);
	char q[QUOTE_MAX];

	if (!json_errors) {
		fputs("tensorctl: ", stderr);
		if (prefix)
			fprintf(stderr, "tensor %s: ", quote(name, QUOTE_MSG, q, sizeof(q)));
		fput_quoted(stderr, msg, QUOTE_TEXT);
		fputc('\n', stderr);
	} else {
		fprintf(stderr, "{\"error\": \"%s\", \"errno\": %d, \"message\": \"",
			tensord_err_name(rc), rc < 0 ? -rc : rc);
		if (prefix) {
			fputs("tensor '", stderr);
			json_chars_to(stderr, name);
			fputs("': ", stderr);
		}
		json_chars_to(stderr, msg);
		fputs("\"}\n", stderr);
	}
	return rc == -ETIMEDOUT ? EXIT_TIMEOUT : EXIT_OP;
}

int report_file(int rc, const char *path, const char *why)
{
	char q[QUOTE_MAX], msg[QUOTE_MAX + 1024];

	/* The text line escapes the path as a name; JSON has its own escapes. */
	snprintf(msg, sizeof(msg), "%s: %s",
		 json_errors ? path : quote(path, QUOTE_TABLE, q, sizeof(q)), why);
	return report(rc ? rc : -EINVAL, msg, NULL);
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
const char *human(uint64_t b, char *buf, size_t len)
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

/*
 * Writes the characters of s, escaped for the inside of a JSON string, to
 * f. JSON must be UTF-8: a byte that is not part of a valid sequence
 * becomes U+FFFD. Controls (C0, DEL, C1) and the characters a terminal
 * reorders (cp_unsafe()) are written as \u escapes, so printing the JSON
 * is as safe as printing the text.
 */
static void json_chars_to(FILE *f, const char *s)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
	uint32_t c;
	size_t n;

	for (; p < end; p += n) {
		n = utf8_next(p, end, &c);
		if (!n) {
			fputs("\\ufffd", f);
			n = 1;
		} else if (c == '"' || c == '\\') {
			fprintf(f, "\\%c", (int)c);
		} else if (cp_unsafe(c)) {
			fprintf(f, "\\u%04" PRIx32, c);
		} else {
			fwrite(p, 1, n, f);
		}
	}
}

/* Writes s as a JSON string to f. */
static void json_str_to(FILE *f, const char *s)
{
	fputc('"', f);
	json_chars_to(f, s);
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
	       ", \"id\": %" PRIu64 ", \"generation\": %" PRIu64 ", \"commit\": %" PRIu64 "}%s",
	       in->nbytes, in->byte_offset, state_name(in->state), in->refcount, in->owner_uid,
	       in->owner_gid, (unsigned)(in->mode & 07777),
	       in->flags & TENSORD_MUTABLE ? "true" : "false",
	       in->flags & TENSORD_LIFETIME_CONNECTION ? "connection" : "persistent",
	       in->created_ns, iso_time(in->created_ns, t, sizeof(t)), in->id, in->generation,
	       in->commit, end);
}

/* --- text -------------------------------------------------------------------------- */

void print_info(const tensord_info *in)
{
	char b1[INTS_MAX], b2[64];

	char q[QUOTE_MAX];

	printf("name:     %s\n", quote(in->name, QUOTE_TABLE, q, sizeof(q)));
	printf("dtype:    %s\n", tensord_dtype_name(in->dtype, b2, sizeof(b2)));
	printf("shape:    %s\n", ints(in->shape, in->ndim, false, b1, sizeof(b1)));
	printf("strides:  %s\n", ints(in->strides, in->ndim, false, b1, sizeof(b1)));
	printf("device:   %s\n", tensord_device_name(in->device, b2, sizeof(b2)));
	printf("bytes:    %" PRIu64 " (%s)\n", in->nbytes, human(in->nbytes, b2, sizeof(b2)));
	printf("state:    %s\n", state_name(in->state));
	printf("refs:     %" PRIu32 "\n", in->refcount);
	printf("owner:    %s (uid %" PRIu32 ", gid %" PRIu32 ")\n",
	       quote(owner_name(in->owner_uid, b2, sizeof(b2)), QUOTE_TABLE, q, sizeof(q)),
	       in->owner_uid, in->owner_gid);
	printf("mode:     %04o\n", (unsigned)(in->mode & 07777));
	printf("flags:    %s, %s\n", in->flags & TENSORD_MUTABLE ? "mutable" : "immutable",
	       in->flags & TENSORD_LIFETIME_CONNECTION ? "connection lifetime" : "persistent");
	printf("created:  %s\n", iso_time(in->created_ns, b2, sizeof(b2)));
	printf("id:       %" PRIu64 "\n", in->id);
	printf("gen:      %" PRIu64 "\n", in->generation);
	printf("commit:   %" PRIu64 "\n", in->commit);
}

enum {
	COL_NAME,
	COL_DTYPE,
	COL_SHAPE,
	COL_DEVICE,
	COL_BYTES,
	COL_STATE,
	COL_GEN,
	COL_COMMIT,
	COL_REFS,
	COL_OWNER,
	NCOL
};

static const char *const col_title[NCOL] = { "NAME",  "DTYPE", "SHAPE",  "DEVICE", "BYTES",
					     "STATE", "GEN",   "COMMIT", "REFS",   "OWNER" };

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
	case COL_GEN:
	case COL_COMMIT:
		/* 0 before publish: shown as "-", as nothing was published yet. */
		if (!(col == COL_GEN ? in->generation : in->commit))
			return "-";
		snprintf(buf, len, "%" PRIu64, col == COL_GEN ? in->generation : in->commit);
		return buf;
	case COL_REFS:
		snprintf(buf, len, "%" PRIu32, in->refcount);
		return buf;
	default:
		return owner_name(in->owner_uid, buf, len);
	}
}

/* Columns a cell takes: its code points (quote() left only printable ones). */
static size_t cell_width(const char *s)
{
	size_t w = 0;

	for (; *s; s++)
		w += ((unsigned char)*s & 0xc0) != 0x80;
	return w;
}

/* Cell i of col (row 0: the title), quoted: names and process names come from outside. */
static const char *table_cell(const char *const *titles, const void *rows, size_t i, int col,
			      table_cell_fn *cell_of, char *buf, size_t len, char *q, size_t qlen)
{
	const char *cell = i ? cell_of(rows, i - 1, col, buf, len) : titles[col];

	return quote(cell ? cell : "", QUOTE_TABLE, q, qlen);
}

void print_table(const char *const *titles, int ncol, unsigned right, const void *rows, size_t n,
		 table_cell_fn *cell_of)
{
	char buf[INTS_MAX], q[QUOTE_MAX];
	size_t i, cw, w[TABLE_COLS_MAX] = { 0 };
	const char *cell;
	int k;

	/* Two passes: column widths first, then the rows. */
	for (i = 0; i <= n; i++)
		for (k = 0; k < ncol; k++) {
			cw = cell_width(table_cell(titles, rows, i, k, cell_of, buf, sizeof(buf), q,
						   sizeof(q)));
			if (cw > w[k])
				w[k] = cw;
		}
	/* Numbers align right, text left; the last column is not padded. */
	for (i = 0; i <= n; i++) {
		for (k = 0; k < ncol; k++) {
			cell = table_cell(titles, rows, i, k, cell_of, buf, sizeof(buf), q,
					  sizeof(q));
			cw = cell_width(cell);
			if (k == ncol - 1) {
				printf("%s\n", cell);
			} else if (right & (1u << k)) {
				printf("%*s%s  ", (int)(w[k] - cw), "", cell);
			} else {
				printf("%s%*s  ", cell, (int)(w[k] - cw), "");
			}
		}
	}
}

void print_ls_table(const tensord_info *infos, size_t n)
{
	print_table(col_title, NCOL,
		    1u << COL_BYTES | 1u << COL_GEN | 1u << COL_COMMIT | 1u << COL_REFS, infos, n,
		    ls_cell);
}
