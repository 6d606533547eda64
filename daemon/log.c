#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

int log_level = TD_LOG_INFO;

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

void log_write(int level, const char *fmt, ...)
{
	char line[1024];
	struct timespec ts;
	struct tm tm;
	va_list ap;
	int n;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ",
		     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
		     ts.tv_nsec / 1000000, level_names[level & 7] ? level_names[level & 7] : "?");
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	/* One write per line, so lines from a crash report never interleave. */
	n = (int)strlen(line);
	line[n++] = '\n';
	fwrite(line, 1, (size_t)n, stderr);
	fflush(stderr);
}
