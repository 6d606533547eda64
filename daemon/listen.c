/*
 * The listening socket. We bind and accept ourselves (a uv_poll_t on the
 * listening fd) rather than through uv_pipe_t: we need the socket's mode
 * set before any client can connect, SO_PEERCRED on each accepted fd, and
 * the accepted fds served by our own recvmsg/sendmsg. Under socket
 * activation the socket comes ready-made from systemd (sdnotify.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/paths.h"
#include "log.h"
#include "sdnotify.h"
#include "server.h"

/* Is a daemon answering at path? A stale file from a dead one refuses. */
bool server_socket_is_live(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool live;

	if (fd < 0)
		return false;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	live = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return live;
}

/*
 * The socket's directory, when it is one of the default ones. The private
 * one under /tmp (common/paths.c) is made 0700 and must be ours and closed
 * to others, so that nobody can squat it before us; it is open to search
 * (0711) only while --mode lets others connect. /run/tensord is made for a
 * root daemon. 0, or -errno with the reason logged.
 */
static int prepare_dir(const struct server_config *cfg)
{
	const char *path = cfg->socket_path;
	char dir[TD_SOCKET_PATH_MAX], why[400];
	uid_t me = geteuid();

	if (me == 0 && strcmp(path, TD_SYSTEM_SOCKET) == 0)
		mkdir("/run/tensord", 0755);
	if (!td_in_private_dir(path, me))
		return 0;
	snprintf(dir, sizeof(dir), "%.*s", (int)(strrchr(path, '/') - path), path);
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		int e = errno;

		log_error("socket directory %s: %s", dir, strerror(e));
		return -e;
	}
	if (td_private_dir_check(dir, me, why, sizeof(why)) < 0) {
		log_error("refusing the socket directory: %s; someone else may be squatting it: "
			  "remove it, or use --socket PATH",
			  why);
		return -EPERM;
	}
	if (chmod(dir, cfg->socket_mode & 066 ? 0711 : 0700) < 0)
		log_warn("socket directory %s: chmod for --mode %03o: %s", dir,
			 (unsigned)cfg->socket_mode, strerror(errno));
	return 0;
}

static void on_listen(uv_poll_t *h, int status, int events)
{
	struct server *srv = h->data;

	for (int i = 0; i < 64; i++) {
		int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd >= 0) {
			conn_accept(&srv->conns, fd);
			continue;
		}
		if (errno == EINTR || errno == ECONNABORTED)
			continue;
		if (errno == EMFILE || errno == ENFILE) {
			/* Out of descriptors: shed the client instead of spinning
			 * on a listen socket that stays readable. */
			log_limited(TD_LOG_WARN, LOG_KIND_REFUSED_ACCEPT, NULL, NULL,
				    "accept: %s, shedding one client", strerror(errno));
			if (srv->reserve_fd >= 0) {
				close(srv->reserve_fd);
				fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
				if (fd >= 0)
					close(fd);
				srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
			}
		}
		return;
	}
}

/* Binds path itself: replaces a stale socket, never a live one. The fd, or -errno. */
static int bind_socket(const struct server_config *cfg)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	const char *path = cfg->socket_path;
	mode_t old;
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		log_error("socket path %s: longer than %zu bytes", path, sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	r = prepare_dir(cfg);
	if (r < 0)
		return r;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;

	if (access(path, F_OK) == 0) {
		struct stat st;

		if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
			log_error("socket path %s: exists and is not a socket; not touching it",
				  path);
			close(fd);
			return -EEXIST;
		}
		if (server_socket_is_live(path)) {
			log_error("socket path %s: another tensord is serving it", path);
			close(fd);
			return -EADDRINUSE;
		}
		log_info("socket path %s: replacing a stale socket", path);
		unlink(path);
	}
	/* Create it 0600, so nobody can connect before the mode is final. */
	old = umask(0177);
	r = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (r < 0) {
		r = -errno;
		log_error("socket path %s: bind: %s", path, strerror(-r));
		close(fd);
		return r;
	}
	if ((cfg->socket_gid != (gid_t)-1 && chown(path, (uid_t)-1, cfg->socket_gid) < 0) ||
	    chmod(path, cfg->socket_mode) < 0) {
		r = -errno;
		log_error("socket path %s: setting mode/group: %s", path, strerror(-r));
		close(fd);
		unlink(path);
		return r;
	}
	if (listen(fd, 512) < 0) {
		r = -errno;
		close(fd);
		unlink(path);
		return r;
	}
	return fd;
}

/*
 * Takes the listening socket systemd passed (tensord.socket): it must be a
 * listening Unix stream socket. Its path replaces --socket in the logs; its
 * mode and group are the socket unit's business. Returns fd, or -errno
 * after closing it.
 */
static int adopt_socket(struct server *srv, int fd)
{
	struct sockaddr_un sa;
	socklen_t len = sizeof(sa), olen = sizeof(int);
	int domain = 0, type = 0, listening = 0;

	if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &olen) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &olen) < 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &olen) < 0 || domain != AF_UNIX ||
	    type != SOCK_STREAM || !listening) {
		log_error("socket activation: descriptor %d is not a listening Unix stream socket "
			  "(ListenStream= in tensord.socket must be a path)",
			  fd);
		close(fd);
		return -ENOTSOCK;
	}
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) {
		close(fd);
		return -errno;
	}
	memset(&sa, 0, sizeof(sa));
	if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0 && sa.sun_path[0])
		snprintf(srv->cfg.socket_path, sizeof(srv->cfg.socket_path), "%s", sa.sun_path);
	srv->socket_inherited = true;
	return fd;
}

int server_listen(struct server *srv)
{
	const char *why = "";
	int fd = sdnotify_listen_fd(&why);

	if (fd < -1) {
		log_error("socket activation: %s", why);
		return fd;
	}
	fd = fd >= 0 ? adopt_socket(srv, fd) : bind_socket(&srv->cfg);
	if (fd < 0)
		return fd;
	srv->listen_fd = fd;
	srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	uv_poll_init(srv->loop, &srv->listen_poll, fd);
	srv->listen_poll.data = srv;
	uv_poll_start(&srv->listen_poll, UV_READABLE, on_listen);
	if (srv->socket_inherited)
		log_info("listening on %s (passed by the service manager)", srv->cfg.socket_path);
	else
		log_info("listening on %s (mode %03o)", srv->cfg.socket_path,
			 (unsigned)srv->cfg.socket_mode);
	return 0;
}

void server_unlisten(struct server *srv)
{
	uv_poll_stop(&srv->listen_poll);
	uv_close((uv_handle_t *)&srv->listen_poll, NULL);
	close(srv->listen_fd);
	/* A passed socket belongs to the service manager, which listens on. */
	if (!srv->socket_inherited)
		unlink(srv->cfg.socket_path);
	if (srv->reserve_fd >= 0)
		close(srv->reserve_fd);
}
