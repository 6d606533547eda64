/*
 * sd_notify and sd_listen_fds, spoken directly. Both protocols are a few
 * lines and documented as stable interfaces for exactly this use (systemd's
 * "Interface Portability and Stability" page lists them), so the daemon
 * does not link libsystemd: it runs the same in a container or under
 * another supervisor, where libsystemd would be a dependency for nothing.
 */
#include "sdnotify.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/base/log.h"

#define SD_LISTEN_FDS_START 3

static struct sockaddr_un notify_addr;
static socklen_t notify_addr_len; /* 0: no notify socket */

void sdnotify_init(void)
{
	const char *p = getenv("NOTIFY_SOCKET");
	size_t len;

	if (!p)
		return;
	len = strlen(p);
	/* A path, or "@name" for the abstract namespace (a leading NUL). */
	if ((p[0] == '/' || p[0] == '@') && len >= 2 && len < sizeof(notify_addr.sun_path)) {
		notify_addr.sun_family = AF_UNIX;
		memcpy(notify_addr.sun_path, p, len);
		if (p[0] == '@')
			notify_addr.sun_path[0] = '\0';
		notify_addr_len =
			(socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (p[0] == '/'));
	} else {
		log_warn("NOTIFY_SOCKET=%s: not a socket path, ignoring", p);
	}
	unsetenv("NOTIFY_SOCKET");
}

void sdnotify(const char *fmt, ...)
{
	static bool complained;
	char msg[512];
	va_list ap;
	int fd, n;

	if (!notify_addr_len)
		return;
	va_start(ap, fmt);
	n = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(msg))
		n = (int)strlen(msg);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && sendto(fd, msg, (size_t)n, MSG_NOSIGNAL, (struct sockaddr *)&notify_addr,
			      notify_addr_len) == n) {
		close(fd);
		return;
	}
	if (!complained)
		log_debug("notify socket: %s, ignoring", strerror(errno));
	complained = true;
	if (fd >= 0)
		close(fd);
}

/* "123" into *ret; false unless it is a whole positive decimal number. */
static bool parse_positive(const char *s, long *ret)
{
	char *end;

	errno = 0;
	*ret = strtol(s, &end, 10);
	return s[0] && !*end && !errno && *ret > 0;
}

int sdnotify_listen_fd(const char **why)
{
	const char *pid_s = getenv("LISTEN_PID"), *fds_s = getenv("LISTEN_FDS");
	long pid, n;
	int r = -1;

	if (!pid_s || !fds_s)
		goto out;
	/* Meant for another process (our parent, if it exec'ed us by mistake). */
	if (!parse_positive(pid_s, &pid) || pid != (long)getpid())
		goto out;
	if (!parse_positive(fds_s, &n) || n > 64) {
		*why = "LISTEN_FDS is not a small positive number";
		r = -EINVAL;
		goto out;
	}
	for (long i = 0; i < n; i++) {
		int fd = SD_LISTEN_FDS_START + (int)i;

		if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
			*why = "LISTEN_FDS names a descriptor that is not open";
			r = -EBADF;
			goto out;
		}
		if (i > 0) {
			log_warn("LISTEN_FDS: descriptor %d is one more than tensord serves, "
				 "closing it",
				 fd);
			close(fd);
		}
	}
	r = SD_LISTEN_FDS_START;
out:
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	return r;
}
