/*
 * sd_notify and sd_listen_fds, spoken directly. Both protocols are a few
 * lines and documented as stable interfaces for exactly this use (systemd's
 * "Interface Portability and Stability" page lists them), so the daemon
 * does not link libsystemd: it runs the same in a container or under
 * another supervisor, where libsystemd would be a dependency for nothing.
 */
#include "daemon/base/sdnotify.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
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

/* The descriptors the service manager passed, read once (sdnotify_passed()). */
static struct sd_passed_fd *passed;
static size_t n_passed;
static bool passed_read;

/*
 * The n-th name of LISTEN_FDNAMES (colon-separated), or "" when it has
 * fewer; at most 255 bytes, as systemd allows.
 */
static void fd_name(const char *names, size_t i, char *buf, size_t len)
{
	const char *p = names, *end;

	buf[0] = '\0';
	for (; p && i > 0; i--) {
		p = strchr(p, ':');
		if (p)
			p++;
	}
	if (!p)
		return;
	end = strchr(p, ':');
	if (!end)
		end = p + strlen(p);
	snprintf(buf, len, "%.*s", (int)(end - p), p);
}

int sdnotify_passed(struct sd_passed_fd **ret, const char **why)
{
	const char *pid_s = getenv("LISTEN_PID"), *fds_s = getenv("LISTEN_FDS");
	const char *names = getenv("LISTEN_FDNAMES");
	long pid, n;
	int r = 0;

	if (passed_read)
		goto out;
	passed_read = true;
	if (!pid_s || !fds_s)
		goto done;
	/* Meant for another process (our parent, if it exec'ed us by mistake). */
	if (!parse_positive(pid_s, &pid) || pid != (long)getpid())
		goto done;
	if (!parse_positive(fds_s, &n) || n > SDNOTIFY_PASSED_MAX) {
		*why = "LISTEN_FDS is not a positive number of at most 1048576";
		r = -EINVAL;
		goto done;
	}
	passed = calloc((size_t)n, sizeof(*passed));
	if (!passed) {
		*why = "out of memory for LISTEN_FDS";
		r = -ENOMEM;
		goto done;
	}
	for (long i = 0; i < n; i++) {
		int fd = SD_LISTEN_FDS_START + (int)i;

		if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
			*why = "LISTEN_FDS names a descriptor that is not open";
			r = -EBADF;
			for (long j = 0; j < i; j++)
				close(passed[j].fd);
			free(passed);
			passed = NULL;
			goto done;
		}
		passed[i].fd = fd;
		fd_name(names, (size_t)i, passed[i].name, sizeof(passed[i].name));
	}
	n_passed = (size_t)n;
done:
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	if (r < 0)
		return r;
out:
	*ret = passed;
	return (int)n_passed;
}

/* Whether fd is a socket: what tensord serves on (the caller checks it listens). */
static bool is_socket(int fd)
{
	struct stat st;

	return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

int sdnotify_listen_fd(const char **why)
{
	struct sd_passed_fd *v;
	int n = sdnotify_passed(&v, why), r = -1;

	/* The socket is recognised by its type, never by its place or name. */
	for (int i = 0; i < n; i++) {
		if (v[i].fd < 0 || !is_socket(v[i].fd))
			continue;
		if (r < 0) {
			r = v[i].fd;
		} else {
			log_warn("LISTEN_FDS: descriptor %d is one more socket than tensord "
				 "serves, closing it",
				 v[i].fd);
			close(v[i].fd);
		}
		v[i].fd = -1;
	}
	return n < 0 ? n : r;
}

int sdnotify_take_named(const char *prefix, char *name, size_t name_len)
{
	const char *why;
	struct sd_passed_fd *v;
	int n = sdnotify_passed(&v, &why), fd;

	for (int i = 0; i < n; i++) {
		if (v[i].fd < 0 || strncmp(v[i].name, prefix, strlen(prefix)) != 0)
			continue;
		fd = v[i].fd;
		v[i].fd = -1;
		snprintf(name, name_len, "%s", v[i].name);
		return fd;
	}
	return -1;
}

void sdnotify_passed_end(void)
{
	for (size_t i = 0; i < n_passed; i++) {
		if (passed[i].fd < 0)
			continue;
		log_warn("LISTEN_FDS: descriptor %d ('%s') is nothing tensord knows, closing it",
			 passed[i].fd, passed[i].name);
		close(passed[i].fd);
	}
	free(passed);
	passed = NULL;
	n_passed = 0;
}

/* --- the file descriptor store (docs/restart.md, section 2) ------------------------- */

/* Adds fd, named name, to the passed list (the holder's hand-over). */
static int passed_add(int fd, const char *name)
{
	if (n_passed % 256 == 0) {
		struct sd_passed_fd *v = realloc(passed, (n_passed + 256) * sizeof(*v));

		if (!v)
			return -ENOMEM;
		passed = v;
	}
	passed[n_passed].fd = fd;
	snprintf(passed[n_passed].name, sizeof(passed[n_passed].name), "%s", name);
	n_passed++;
	return 0;
}

/*
 * Connects s to the holder at sa: a holder started with the daemon (a
 * pod's two containers) may take a moment to bind, so up to 10 s. 0 or -errno.
 */
static int connect_holder(int s, const struct sockaddr_un *sa)
{
	for (int i = 0;; i++) {
		struct timespec ts = { 0, 50 * 1000000L };

		if (connect(s, (const struct sockaddr *)sa, sizeof(*sa)) == 0)
			return 0;
		if ((errno != ENOENT && errno != ECONNREFUSED) || i == 200)
			return -errno;
		nanosleep(&ts, NULL);
	}
}

int sdnotify_use_holder(const char *dir, char *why, size_t why_len)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	static char buf[65536];
	int s, r = 0;

	if (snprintf(notify_addr.sun_path, sizeof(notify_addr.sun_path), "%s/notify", dir) >=
		    (int)sizeof(notify_addr.sun_path) ||
	    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/take", dir) >=
		    (int)sizeof(sa.sun_path)) {
		snprintf(why, why_len, "--holder %s: the path is too long", dir);
		return -ENAMETOOLONG;
	}
	notify_addr.sun_family = AF_UNIX;
	notify_addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
				      strlen(notify_addr.sun_path) + 1);
	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	r = s < 0 ? -errno : connect_holder(s, &sa);
	if (r < 0) {
		snprintf(why, why_len,
			 "--holder %s: no holder answers at %s: %s (start one with tensord "
			 "--hold %s)",
			 dir, sa.sun_path, strerror(-r), dir);
		if (s >= 0)
			close(s);
		return r;
	}
	/* LISTEN_FDS is not for us now: the holder's store is. */
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	passed_read = true;
	/* Messages of names ("a:b:c") with their descriptors; an empty one ends it. */
	for (;;) {
		union {
			char b[CMSG_SPACE(256 * sizeof(int))];
			struct cmsghdr align;
		} u;
		struct iovec iov = { buf, sizeof(buf) - 1 };
		struct msghdr mh = { .msg_iov = &iov,
				     .msg_iovlen = 1,
				     .msg_control = u.b,
				     .msg_controllen = sizeof(u.b) };
		int fds[256], n_fds = 0;
		ssize_t n = recvmsg(s, &mh, MSG_CMSG_CLOEXEC);
		char *name, *save = NULL;

		if (n <= 0 || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
			r = n < 0 ? -errno : -EPROTO;
			snprintf(why, why_len,
				 "--holder %s: the hand-over of the store broke off: %s", dir,
				 n < 0 ? strerror(errno) : "cut short");
			break;
		}
		buf[n] = '\0';
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
			if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
				for (size_t i = 0;
				     i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int) && n_fds < 256;
				     i++)
					memcpy(&fds[n_fds++], CMSG_DATA(cm) + i * sizeof(int),
					       sizeof(int));
		if (!buf[0] && !n_fds)
			break;
		name = strtok_r(buf, ":", &save);
		for (int i = 0; i < n_fds; i++) {
			if (r == 0)
				r = passed_add(fds[i], name ? name : "");
			if (r < 0)
				close(fds[i]);
			name = name ? strtok_r(NULL, ":", &save) : NULL;
		}
		if (r < 0) {
			snprintf(why, why_len, "--holder %s: out of memory for the store", dir);
			break;
		}
	}
	close(s);
	return r;
}

bool sdnotify_can_store(void)
{
	return notify_addr_len != 0;
}

/* Sends msg with fd (-1: none) to the service manager, blocking: 0 or -errno. */
static int send_with_fd(const char *msg, int fd)
{
	static int sock = -1;
	struct iovec iov = { .iov_base = (void *)msg, .iov_len = strlen(msg) };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = { .msg_name = &notify_addr,
			     .msg_namelen = notify_addr_len,
			     .msg_iov = &iov,
			     .msg_iovlen = 1 };

	if (!notify_addr_len)
		return -ENOTCONN;
	if (sock < 0) {
		sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		if (sock < 0)
			return -errno;
	}
	if (fd >= 0) {
		struct cmsghdr *cm;

		memset(&u, 0, sizeof(u));
		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	}
	for (;;) {
		if (sendmsg(sock, &mh, MSG_NOSIGNAL) >= 0)
			return 0;
		if (errno != EINTR)
			return -errno;
	}
}

int sdnotify_fdstore(int fd, const char *name)
{
	char msg[320];

	/* FDPOLL=0: a memfd is never closed for a POLLHUP it does not have. */
	snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s\nFDPOLL=0", name);
	return send_with_fd(msg, fd);
}

int sdnotify_fdstore_remove(const char *name)
{
	char msg[320];

	snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", name);
	return send_with_fd(msg, -1);
}
