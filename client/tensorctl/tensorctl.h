/*
 * tensorctl's shared declarations. tensorctl.c parses the command line and
 * runs one command; commands.c holds the commands, which call libtensord;
 * output.c everything printed: tables and JSON on stdout, failure reports
 * on stderr; npy*.c read and write .npy files (npy.h).
 */
#ifndef TENSORD_TENSORCTL_H
#define TENSORD_TENSORCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tensord/tensord.h>

/* Exit statuses (docs/tensorctl.md, "Exit status"). 124: as timeout(1). */
#define EXIT_OP 1
#define EXIT_USAGE 2
#define EXIT_TIMEOUT 124

/* Options, as bits, so each command can say which it takes. */
enum {
	OPT_JSON = 1,
	OPT_MUTABLE = 2,
	OPT_MODE = 4,
	OPT_LIFETIME = 8,
	OPT_TIMEOUT = 16,
	OPT_FORCE = 32,
	OPT_PROMETHEUS = 64,
	OPT_AFTER = 128,
	OPT_QUEUE = 256,
	OPT_PREFIX = 512,
	OPT_GROUP = 1024,
	OPT_RAW = 2048,
};

/* ls, leases and watch --group: rows folded by prefix or by commit. */
enum group_by { GROUP_NONE, GROUP_PREFIX, GROUP_COMMIT };

struct args {
	const char *socket; /* borrowed from argv; NULL: the library's default */
	const char **pos;   /* positionals after the command, borrowed from argv (argc slots) */
	int npos;
	unsigned seen;  /* OPT_* given */
	uint32_t flags; /* TENSORD_MUTABLE | TENSORD_LIFETIME_CONNECTION | TENSORD_REPLACE */
	uint32_t mode;
	int timeout_ms; /* -1: forever */
	uint64_t after; /* watch --after: a commit id (0: replay every name); seen says if given */
	uint32_t queue; /* watch --queue: events kept for it; 0: the default */
	enum group_by group; /* --group */
};

/*
 * --- commands.c ---
 * Each returns the exit status: 0, EXIT_OP after reporting the failure on
 * stderr. Borrowed: c and a, only for the call.
 */
int cmd_ls(tensord_client *c, const struct args *a);
int cmd_stat(tensord_client *c, const struct args *a);
int cmd_stats(tensord_client *c, const struct args *a);
int cmd_rm(tensord_client *c, const struct args *a);
int cmd_wait(tensord_client *c, const struct args *a);

/*
 * --- checkpoint.c: put and get, files read and written by libtensord ---
 * put NAME FILE.npy, put PREFIX FILE.npz|FILE.safetensors (one commit);
 * get NAME OUT.npy|-, get PREFIX OUT.npz|OUT.safetensors (from one commit).
 * is_checkpoint(): whether path names a file of a set (by its extension).
 */
int cmd_put(tensord_client *c, const struct args *a);
int cmd_get(tensord_client *c, const struct args *a);
bool is_checkpoint(const char *path);

/* --- watch.c: events under a prefix, a line each, until interrupted --- */
int cmd_watch(tensord_client *c, const struct args *a);
/* Blocks SIGINT and SIGTERM, for cmd_watch's signalfd: called before connecting, so that
 * libtensord's threads inherit the mask. 0 or -1 (errno). */
int watch_block_signals(void);

/* --- observe.c: who holds what, who is connected, the metrics text --- */
int cmd_leases(tensord_client *c, const struct args *a);
int cmd_clients(tensord_client *c, const struct args *a);
int cmd_peers(tensord_client *c, const struct args *a);
/* stats --prometheus: the daemon's metrics text, as its --metrics endpoint serves it. */
int print_prometheus(tensord_client *c);

/* --- output.c: untrusted text --- */

/*
 * How quote() shows a string from argv or the daemon. Clean text (valid
 * UTF-8 without controls, DEL, C1 or bidirectional controls) prints as
 * it is; otherwise those characters and stray bytes become C escapes
 * ("\033", "\n", "\377"), as ls and git print odd file names:
 *  QUOTE_TABLE: a name as a word: bare when clean, else "in double quotes",
 *               with \" and \\ escaped too (a name holding ', " or \, or
 *               an empty one, is quoted so as well);
 *  QUOTE_MSG:   a name inside a sentence: 'in single quotes' when clean,
 *               else as QUOTE_TABLE;
 *  QUOTE_TEXT:  a sentence (a daemon message): escaped in place, no quotes.
 */
enum quote_how { QUOTE_TABLE, QUOTE_MSG, QUOTE_TEXT };

/* Room for any daemon name escaped (255 bytes, 4 each) and then some. */
#define QUOTE_MAX 1280

/*
 * s as how says, in buf (len bytes; longer results are cut with "...") or
 * s itself when it needs no change (never for QUOTE_MSG). Borrowed: the
 * result, valid while s and buf are.
 */
const char *quote(const char *s, enum quote_how how, char *buf, size_t len);

/* --- output.c: failure reports --- */

/*
 * The daemon's or library's message for the failed call, else strerror.
 * Borrowed: valid until the next libtensord call on this thread.
 */
const char *errmsg(int rc);

/*
 * Reports the failure rc (a negative errno) with msg on stderr, made to
 * name the tensor when there is one (name may be NULL): one line of text,
 * or one JSON object after report_as_json(true). Returns the exit status:
 * EXIT_TIMEOUT for -ETIMEDOUT, else EXIT_OP.
 */
int report(int rc, const char *msg, const char *name);

/* Whether report() writes JSON (--json was given). */
void report_as_json(bool on);

/*
 * Reports that the file path failed (rc a negative errno, 0: -EINVAL) for
 * the reason why, as report() does: "tensorctl: PATH: why", or JSON.
 */
int report_file(int rc, const char *path, const char *why);

/* report(errmsg(rc), name). */
int op_error(int rc, const char *name);

/* Flushes stdout; a failed write (a full disk, a closed pipe) is an operation error. */
int finish_output(void);

/* --- output.c: what the read commands print on stdout --- */

/* One tensor as a JSON object, followed by end. */
void json_info(const tensord_info *in, const char *end);

/* One tensor as "key: value" lines, for stat. */
void print_info(const tensord_info *in);

/* The ls table: a header line, then one aligned row per tensor. */
void print_ls_table(const tensord_info *infos, size_t n);

/*
 * An aligned table: a header of ncol titles, then one row per record.
 * cell_of(rows, i, col, buf, len) gives the text of a cell, in buf or
 * static. Columns whose bit is set in right align right (numbers).
 */
#define TABLE_COLS_MAX 16
typedef const char *table_cell_fn(const void *rows, size_t i, int col, char *buf, size_t len);
void print_table(const char *const *titles, int ncol, unsigned right, const void *rows, size_t n,
		 table_cell_fn *cell_of);

/* Helpers the formats share. */
const char *state_name(tensord_state s);
const char *owner_name(uint32_t uid, char *buf, size_t len);
/* ns since the epoch as "2024-05-01T12:34:56.123456789Z". */
const char *iso_time(uint64_t ns, char *buf, size_t len);
/* s as a JSON string; ", \"key\": value" (no comma when first). */
void json_str(const char *s);
void json_field(const char *key, const char *val, bool first);

/* figures.c: the daemon's n figures as text: a line each, then the devices and uids as tables.
 * 0, or -1 (out of memory, reported). */
int print_figures_text(const tensord_figure *v, size_t n);
/* stats without --raw: the figures people read first, then devices and uids as tables. 0 or -1. */
int print_stats_summary(const tensord_figure *v, size_t n);

/* "3d04h", "2h05m", "4m07s", "12.3s" (observe.c). Borrowed: buf. */
const char *duration(uint64_t ns, char *buf, size_t len);

/*
 * --- group.c: ls and leases --group prefix|commit ---
 * A name's prefix: its length up to and including the last '/' (0: none).
 */
size_t group_prefix_len(const char *name);
/* Folds name into the common prefix p (*plen bytes; first: starts it), cut back to a '/'. */
void group_common_prefix(char *p, size_t *plen, const char *name, bool first);
/* The grouped tables (or JSON lists); they may reorder the arrays. 0 or the exit status. */
int print_ls_groups(tensord_info *infos, size_t n, enum group_by by, bool json);
int print_lease_groups(tensord_lease_holder *v, size_t n, enum group_by by, bool json);

/* b bytes for people: "512 B", "1.5 MiB". Borrowed: buf. */
const char *human(uint64_t b, char *buf, size_t len);

#endif /* TENSORD_TENSORCTL_H */
