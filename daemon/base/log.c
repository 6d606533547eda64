/*
 * One line per event on stderr. Read by a person, each line starts with a
 * UTC timestamp and the level; when stderr is the journal (systemd sets
 * $JOURNAL_STREAM to the device and inode of the stream it connected), the
 * line starts with the sd-daemon(3) priority prefix "<N>" instead, and the
 * journal adds the time itself.
 */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/paths.h"

int log_level = TD_LOG_INFO;
static bool to_journal;

/* --log-file, or NULL for plain stderr. Owned; lives as long as the process. */
static char *log_path;

static const char *const level_names[8] = {
	[TD_LOG_ERROR] = "error",
	[TD_LOG_WARN] = "warn",
	[TD_LOG_INFO] = "info",
	[TD_LOG_DEBUG] = "debug",
};

int log_level_parse(const char *s, int *ret_level)
{
	for (int i = 0; i < 8; i++) {
		if (level_names[i] && strcmp(s, level_names[i]) == 0) {
			*ret_level = i;
			return 0;
		}
	}
	if (strcmp(s, "warning") == 0) {
		*ret_level = TD_LOG_WARN;
		return 0;
	}
	return -EINVAL;
}

/* Formats the reason a log file is refused into why (which may be NULL). */
static void say(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (!why || !len)
		return;
	va_start(ap, fmt);
	vsnprintf(why, len, fmt, ap);
	va_end(ap);
}

/* What the log may be appended to: a file of root's or ours, with one name. */
static int log_file_ok(const struct stat *st, char *why, size_t len)
{
	if (!S_ISREG(st->st_mode)) {
		say(why, len, "it is a %s, not a regular file", td_file_type(st->st_mode));
		return S_ISLNK(st->st_mode) ? -ELOOP : -EINVAL;
	}
	if (st->st_uid != 0 && st->st_uid != geteuid()) {
		say(why, len, "it is owned by uid %u, not by root or uid %u (the daemon's)",
		    (unsigned)st->st_uid, (unsigned)geteuid());
		return -EPERM;
	}
	if (st->st_nlink > 1) {
		say(why, len,
		    "it has %lu hard links: another of its names may be a file the "
		    "daemon must not write",
		    (unsigned long)st->st_nlink);
		return -EPERM;
	}
	return 0;
}

/*
 * Opens the log file without following a link, in a directory that passes
 * td_dir_rule(), refusing anything but a regular file of root's or ours:
 * the daemon may be root, and the path a name someone else could plant.
 * O_NONBLOCK keeps a FIFO swapped in after the check from blocking the open.
 */
static int open_log_file(const char *path, char *why, size_t len)
{
	char dir[PATH_MAX], reason[400];
	const char *name;
	struct stat st;
	int dirfd, fd, r;

	if (td_path_split(path, dir, sizeof(dir), &name) < 0) {
		say(why, len, "not a file name");
		return -EINVAL;
	}
	dirfd = td_dir_open(dir, geteuid(), reason, sizeof(reason));
	if (dirfd < 0) {
		say(why, len, "refusing its directory: %s", reason);
		return dirfd;
	}
	/* A clear reason for what is there already; the open decides. */
	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
	    (r = log_file_ok(&st, why, len)) < 0) {
		close(dirfd);
		return r;
	}
	fd = openat(dirfd, name,
		    O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
		    0640);
	r = fd < 0 ? -errno : 0;
	close(dirfd);
	if (r == -ELOOP)
		say(why, len, "it is a symbolic link, not a regular file");
	else if (r < 0)
		say(why, len, "%s", strerror(-r));
	else if (fstat(fd, &st) < 0)
		r = -errno;
	else if ((r = log_file_ok(&st, why, len)) == 0 &&
		 fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0)
		r = -errno;
	if (r < 0 && fd >= 0)
		close(fd);
	return r < 0 ? r : fd;
}

int log_open(const char *path, char *why, size_t len)
{
	int fd = open_log_file(path, why, len);
	char *copy;

	if (fd < 0)
		return fd;
	fflush(stderr);
	if (dup2(fd, STDERR_FILENO) < 0) {
		int e = errno;

		say(why, len, "%s", strerror(e));
		close(fd);
		return -e;
	}
	close(fd);
	to_journal = false; /* stderr is our file now */
	if (log_path != path) {
		copy = strdup(path);
		if (!copy) {
			say(why, len, "out of memory");
			return -ENOMEM;
		}
		free(log_path);
		log_path = copy;
	}
	return 0;
}

int log_reopen(void)
{
	char why[600];
	int r;

	if (!log_path)
		return 1;
	r = log_open(log_path, why, sizeof(why));
	if (r < 0)
		log_error("log file %s: %s", log_path, why);
	return r;
}

void log_init(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	/* Only when stderr is still that stream: a shell started from a
	 * service inherits the variable with stderr pointing elsewhere. */
	to_journal = js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 &&
		     fstat(STDERR_FILENO, &st) == 0 && (unsigned long long)st.st_dev == dev &&
		     (unsigned long long)st.st_ino == ino;
}

/* The line's head: "<6>" for the journal, else time and level. Its length. */
static int line_head(char *line, size_t size, int level)
{
	struct timespec ts;
	struct tm tm;

	if (to_journal)
		return snprintf(line, size, "<%d>", level & 7);
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	return snprintf(line, size, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ", tm.tm_year + 1900,
			tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
			ts.tv_nsec / 1000000,
			level_names[level & 7] ? level_names[level & 7] : "?");
}

void log_write(int level, const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	int n;

	n = line_head(line, sizeof(line), level);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	/* One write per line, so lines from a crash report never interleave. */
	n = (int)strlen(line);
	line[n++] = '\n';
	fwrite(line, 1, (size_t)n, stderr);
	fflush(stderr);
}
