/*
 * Daemon logging: one line per event on stderr, with a level; in the
 * journal's format when stderr is the journal (log.c).
 */
#ifndef TENSORD_LOG_H
#define TENSORD_LOG_H

enum log_level {
	TD_LOG_ERROR = 3, /* syslog numbering */
	TD_LOG_WARN = 4,
	TD_LOG_INFO = 6,
	TD_LOG_DEBUG = 7,
};

extern int log_level;

/* 0, or -EINVAL when s is not error/warn/info/debug. */
int log_level_parse(const char *s, int *ret_level);

/* Picks the line format from $JOURNAL_STREAM and stderr. Call once, early. */
void log_init(void);

void log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The level is checked before anything is formatted. */
#define log_at(level, ...)                               \
	do {                                                  \
		if ((level) <= log_level)             \
			log_write((level), __VA_ARGS__); \
	} while (0)

#define log_error(...) log_at(TD_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_at(TD_LOG_WARN, __VA_ARGS__)
#define log_info(...) log_at(TD_LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_at(TD_LOG_DEBUG, __VA_ARGS__)

#endif
