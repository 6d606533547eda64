/*
 * tensorctl put and get: files, read and written by libtensord
 * (tensord_put_file(), tensord_get_file()).
 *
 *   put NAME FILE.npy                    one tensor
 *   put PREFIX FILE.npz|FILE.safetensors every array as PREFIX + its name, one commit
 *   get NAME OUT.npy (- for stdout)      one tensor
 *   get PREFIX OUT.npz|OUT.safetensors   every tensor under PREFIX, from one commit
 *
 * A long import shows its progress on stderr when that is a terminal.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "tensorctl.h"

/* Imports under this many bytes show no progress: they are over before it would help. */
#define PROGRESS_MIN (64ull << 20)

static bool has_suffix(const char *path, const char *suffix)
{
	size_t n = strlen(path), k = strlen(suffix);

	return n > k && strcasecmp(path + n - k, suffix) == 0;
}

bool is_checkpoint(const char *path)
{
	return has_suffix(path, ".npz") || has_suffix(path, ".safetensors");
}

struct progress {
	const char *path;
	double last; /* when a line was last drawn, CLOCK_MONOTONIC seconds */
	bool drawn;
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* "tensorctl: FILE: 192.0 MiB of 1.0 GiB (18%)", redrawn in place at most 10 times a second. */
static void show_progress(void *arg, uint64_t done, uint64_t total)
{
	struct progress *p = arg;
	char d[32], t[32], q[QUOTE_MAX];
	double at = now();

	if (total < PROGRESS_MIN || (done < total && at - p->last < 0.1))
		return;
	p->last = at;
	p->drawn = true;
	fprintf(stderr, "\rtensorctl: %s: %s of %s (%d%%)\033[K",
		quote(p->path, QUOTE_TABLE, q, sizeof(q)), human(done, d, sizeof(d)),
		human(total, t, sizeof(t)), (int)(total ? done * 100 / total : 100));
	if (done == total)
		fputc('\n', stderr);
	fflush(stderr);
}

/*
 * Reports the library's message: about the file when it starts with its
 * path, else about the tensor name (a .npy's one tensor, named by the user).
 */
static int file_report(int rc, const char *path, const char *name)
{
	const char *msg = errmsg(rc);
	size_t n = strlen(path);

	if (strncmp(msg, path, n) == 0 && msg[n] == ':')
		return report(rc, msg, NULL);
	return report(rc, msg, name);
}

int cmd_put(tensord_client *c, const struct args *a)
{
	struct progress p = { .path = a->pos[1] };
	tensord_file_options o = { .flags = a->flags, .mode = a->mode };
	char **names = NULL;
	uint64_t commit = 0;
	size_t n = 0;
	int rc;

	if (isatty(STDERR_FILENO) && !(a->seen & OPT_JSON)) {
		o.progress = show_progress;
		o.progress_arg = &p;
	}
	if (!is_checkpoint(a->pos[1]))
		o.format = TENSORD_FILE_NPY; /* whatever its suffix, as put always read it */
	rc = tensord_put_file(c, a->pos[0], a->pos[1], &o, &commit, &names, &n);
	if (p.drawn && rc < 0)
		fputc('\n', stderr);
	if (rc < 0)
		return file_report(rc, a->pos[1], a->pos[0]);
	if (!is_checkpoint(a->pos[1])) {
		free(names);
		return 0;
	}
	if (a->seen & OPT_JSON) {
		printf("{\"commit\": %" PRIu64 ", \"tensors\": [", commit);
		for (size_t i = 0; i < n; i++) {
			json_str(names[i]);
			fputs(i + 1 < n ? ", " : "", stdout);
		}
		puts("]}");
	} else {
		printf("commit %" PRIu64 ": %zu tensor%s\n", commit, n, n == 1 ? "" : "s");
	}
	free(names);
	return finish_output();
}

int cmd_get(tensord_client *c, const struct args *a)
{
	tensord_file_options o = { 0 };
	const char *name = a->pos[0], *path = a->pos[1];
	uint64_t commit = 0;
	size_t n = 0;
	int rc;

	if (strcmp(path, "-") == 0) {
		o.format = TENSORD_FILE_NPY;
		rc = tensord_get_file_fd(c, &name, 1, NULL, STDOUT_FILENO, &o, NULL, NULL);
		return rc < 0 ? report(rc, errmsg(rc), name) : 0;
	}
	if (!is_checkpoint(path)) {
		o.format = TENSORD_FILE_NPY;
		rc = tensord_get_file(c, &name, 1, NULL, path, &o, NULL, NULL);
		return rc < 0 ? file_report(rc, path, name) : 0;
	}
	rc = tensord_get_file(c, NULL, 0, name, path, &o, &commit, &n);
	if (rc < 0)
		return report(rc, errmsg(rc), NULL);
	printf("commit %" PRIu64 ": %zu tensor%s\n", commit, n, n == 1 ? "" : "s");
	return finish_output();
}
