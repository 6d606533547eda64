/*
 * Daemon logging: one line per event on stderr (or --log-file), with a
 * level; in the journal's format when stderr is the journal (log.c). Lines
 * a peer can cause at will go through ratelimit.h.
 */
#ifndef TENSORD_LOG_H
#define TENSORD_LOG_H

#include <stddef.h>

enum log_level {
	TD_LOG_ERROR = 3, /* syslog numbering */
	TD_LOG_WARN = 4,
	TD_LOG_INFO = 6,
	TD_LOG_DEBUG = 7,
};

extern int log_level;

/* 0, or -EINVAL when s is not error/warn/info/debug. */
int log_level_parse(const char *s, int *ret_level);

/*
 * Sends the log (stderr, and so also whatever else writes there) to path,
 * appended, created 0640. The daemon may be root and path a name others
 * could plant, so it is opened without following a symbolic link, in a
 * directory that passes td_dir_rule() (common/paths.h), and must be a
 * regular file of root's or the daemon's uid with one name. 0, or -errno
 * with the reason in why (when why is not NULL).
 *
 * log_reopen() opens the same path again, after a rotation moved the old
 * file away (SIGHUP), logging the reason when it cannot. 0 or -errno; 1
 * when the log is plain stderr and there is nothing to reopen.
 */
int log_open(const char *path, char *why, size_t why_len);
int log_reopen(void);

/* Picks the line format from $JOURNAL_STREAM and stderr. Call once, early. */
void log_init(void);

void log_write(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The level is checked before anything is formatted. */
#define log_at(level, ...)                                                                         \
	do {                                                                                       \
		if ((level) <= log_level)                                                          \
			log_write((level), __VA_ARGS__);                                           \
	} while (0)

#define log_error(...) log_at(TD_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_at(TD_LOG_WARN, __VA_ARGS__)
#define log_info(...) log_at(TD_LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_at(TD_LOG_DEBUG, __VA_ARGS__)

#endif
