/*
 * The two halves of the systemd service protocol a daemon speaks: readiness
 * and status through $NOTIFY_SOCKET (sd_notify(3)), and listening sockets
 * handed over through $LISTEN_FDS / $LISTEN_PID (sd_listen_fds(3)). Both are
 * no-ops when the variables are not set, so nothing here depends on systemd.
 */
#ifndef TENSORD_SDNOTIFY_H
#define TENSORD_SDNOTIFY_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Reads and unsets $NOTIFY_SOCKET, so later messages go where systemd said
 * at start-up. Call once, early.
 */
void sdnotify_init(void);

/*
 * Sends one datagram of newline-separated "KEY=value" assignments, e.g.
 * "READY=1\nSTATUS=listening". Does nothing without a notify socket; a
 * failed send is logged once at debug level and otherwise ignored, as
 * sd_notify() callers do.
 */
void sdnotify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* At most this many descriptors passed at start (LISTEN_FDS). */
#define SDNOTIFY_PASSED_MAX (1 << 20)

/* One descriptor passed at start, and its name (LISTEN_FDNAMES; "" for none). */
struct sd_passed_fd {
	int fd; /* -1 once someone took it */
	char name[256];
};

/*
 * Every descriptor the service manager passed ($LISTEN_FDS, for this
 * process by $LISTEN_PID): its socket units' and, on a restart, its file
 * descriptor store's (docs/restart.md). Read on the first call, which
 * unsets the variables and gives each FD_CLOEXEC; *ret is the shared list,
 * in which a caller that takes a descriptor sets its fd to -1. Returns how
 * many (0: none), or -errno with *why set when the variables are malformed.
 */
int sdnotify_passed(struct sd_passed_fd **ret, const char **why);

/*
 * Takes the listening socket out of the passed descriptors, recognised by
 * its type (a socket; the caller checks that it is a listening Unix
 * stream socket), not its place; any more sockets are closed with a
 * warning. The fd, -1 when none was passed, or -errno
 * with *why set.
 */
int sdnotify_listen_fd(const char **why);

/*
 * Takes a passed descriptor whose name begins with prefix (the first one
 * left), copying its name into name: the fd, or -1 when none is left. Call
 * it before sdnotify_listen_fd() for sockets that are not the clients'.
 */
int sdnotify_take_named(const char *prefix, char *name, size_t name_len);

/* Closes, with a warning each, the passed descriptors nobody took. */
void sdnotify_passed_end(void);

/*
 * Without systemd (docs/restart.md, section 6): dir is a holder's
 * (tensord --hold dir). Its store is taken as the passed descriptors (the
 * holder first stops the daemon it handed them to before), and later
 * notify messages go to it. 0, or -errno with the reason (no holder).
 */
int sdnotify_use_holder(const char *dir, char *why, size_t why_len);

/* Whether there is a service manager to store descriptors with ($NOTIFY_SOCKET). */
bool sdnotify_can_store(void);

/*
 * Stores a duplicate of fd in the service manager's file descriptor store
 * under name (FDSTORE=1, FDNAME=, FDPOLL=0): it comes back through
 * LISTEN_FDS at the next start. Blocks until sent. 0 or -errno.
 */
int sdnotify_fdstore(int fd, const char *name);

/* Removes what is stored under name (FDSTOREREMOVE=1). 0 or -errno. */
int sdnotify_fdstore_remove(const char *name);

#endif
