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
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

int log_open(const char *path)
{
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
	char *copy;

	if (fd < 0)
		return -errno;
	fflush(stderr);
	if (dup2(fd, STDERR_FILENO) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	close(fd);
	to_journal = false; /* stderr is our file now */
	if (log_path != path) {
		copy = strdup(path);
		if (!copy)
			return -ENOMEM;
		free(log_path);
		log_path = copy;
	}
	return 0;
}

int log_reopen(void)
{
	return log_path ? log_open(log_path) : 1;
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
