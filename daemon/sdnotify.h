/*
 * The two halves of the systemd service protocol a daemon speaks: readiness
 * and status through $NOTIFY_SOCKET (sd_notify(3)), and listening sockets
 * handed over through $LISTEN_FDS / $LISTEN_PID (sd_listen_fds(3)). Both are
 * no-ops when the variables are not set, so nothing here depends on systemd.
 */
#ifndef TENSORD_SDNOTIFY_H
#define TENSORD_SDNOTIFY_H

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

/*
 * The first descriptor passed by the service manager (fd 3), when
 * $LISTEN_PID is this process and $LISTEN_FDS says at least one. The
 * variables are unset, every passed descriptor gets FD_CLOEXEC, and any
 * beyond the first is closed with a warning. Returns the fd, -1 when none
 * was passed, or -EINVAL with *why set when the variables are malformed.
 */
int sdnotify_listen_fd(const char **why);

#endif
