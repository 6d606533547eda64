/* Daemon logging: one line per event on stderr, with a level. */
#ifndef TENSORD_LOG_H
#define TENSORD_LOG_H

enum tensord_log_level {
	TENSORD_LOG_ERROR = 3, /* syslog numbering */
	TENSORD_LOG_WARN = 4,
	TENSORD_LOG_INFO = 6,
	TENSORD_LOG_DEBUG = 7,
};

extern int tensord_log_level;

/* 0, or -EINVAL when s is not error/warn/info/debug. */
int tensord_log_parse(const char *s, int *ret_level);

void tensord_log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The level is checked before anything is formatted. */
#define tensord_log(level, ...)                               \
	do {                                                  \
		if ((level) <= tensord_log_level)             \
			tensord_log_write((level), __VA_ARGS__); \
	} while (0)

#define log_error(...) tensord_log(TENSORD_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) tensord_log(TENSORD_LOG_WARN, __VA_ARGS__)
#define log_info(...) tensord_log(TENSORD_LOG_INFO, __VA_ARGS__)
#define log_debug(...) tensord_log(TENSORD_LOG_DEBUG, __VA_ARGS__)

#endif
