/*
 * The listening socket. We bind and accept ourselves (a uv_poll_t on the
 * listening fd) rather than through uv_pipe_t: we need the socket's mode
 * set before any client can connect, SO_PEERCRED on each accepted fd, and
 * the accepted fds served by our own recvmsg/sendmsg. Under socket
 * activation the socket comes ready-made from systemd (sdnotify.c).
 *
 * The daemon is often root, and a socket path is a name someone else may
 * be able to change: whoever may write in its directory can swap the
 * socket for a symbolic link right after bind(), and a chmod or chown by
 * path would then change the file the link names. So a socket's directory
 * must pass td_dir_rule() (root's or ours, and closed to others unless
 * sticky), it is opened once and everything happens through that
 * descriptor: the socket is bound from inside it, its mode comes from the
 * umask at bind(), its group is set on an O_PATH descriptor of the entry
 * after checking that the entry is a socket of ours, and the unlink at stop
 * goes through it too. server_socket_bind() does this for the metrics
 * socket as well (metrics_http.c).
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
#include "daemon/base/log.h"
#include "daemon/base/sdnotify.h"
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
 * The directory for a socket at path, opened (its descriptor, or -errno
 * with the reason in why). The private default directory under /tmp
 * (common/paths.c) is made 0700 and must be ours and closed to others, so
 * that nobody can squat it before us; it is open to search (0711) only
 * while mode lets others connect. /run/tensord is made for a root daemon.
 * Any other directory must pass td_dir_rule().
 */
static int open_socket_dir(const char *path, const char *dir, mode_t mode, char *why, size_t len)
{
	char reason[400];
	uid_t me = geteuid();
	int fd, e;

	if (me == 0 && strcmp(path, TD_SYSTEM_SOCKET) == 0)
		mkdir("/run/tensord", 0755);
	if (!td_in_private_dir(path, me)) {
		fd = td_dir_open(dir, me, reason, sizeof(reason));
		if (fd < 0)
			snprintf(why, len, "socket path %s: refusing its directory: %s", path,
				 reason);
		return fd;
	}
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		e = errno;
		snprintf(why, len, "socket directory %s: %s", dir, strerror(e));
		return -e;
	}
	/* Opened without following a link, and checked on the descriptor. */
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		e = errno;
		if (td_private_dir_check(dir, me, reason, sizeof(reason)) == 0)
			snprintf(reason, sizeof(reason), "%s: %s", dir, strerror(e));
	} else if (td_private_dir_checkat(fd, dir, me, reason, sizeof(reason)) < 0) {
		close(fd);
		fd = -1;
	}
	if (fd < 0) {
		snprintf(why, len,
			 "refusing the socket directory: %s; someone else may be squatting it: "
			 "remove it, or use --socket PATH",
			 reason);
		return -EPERM;
	}
	if (fchmod(fd, mode & 066 ? 0711 : 0700) < 0)
		log_warn("socket directory %s: chmod for --mode %03o: %s", dir, (unsigned)mode,
			 strerror(errno));
	return fd;
}

/* Sockets bound by server_socket_bind(), with their directories pinned. */
static struct bound_socket {
	bool used;
	int dirfd; /* owned */
	char path[TD_SOCKET_PATH_MAX];
} bound[4];

/*
 * Binds name in the current directory, which the caller has made the
 * socket's (pinned) directory: replaces a stale socket there, never a
 * live one nor anything else. The socket gets mode from the umask. The
 * bound fd, or -errno with the reason in why.
 */
static int bind_here(const char *path, const char *name, mode_t mode, char *why, size_t len)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	mode_t old;
	int fd, r;

	if (lstat(name, &st) == 0) {
		if (!S_ISSOCK(st.st_mode)) {
			snprintf(why, len, "socket path %s: exists and is a %s; not touching it",
				 path, td_file_type(st.st_mode));
			return -EEXIST;
		}
		if (server_socket_is_live(name)) {
			snprintf(why, len, "socket path %s: another tensord is serving it", path);
			return -EADDRINUSE;
		}
		log_info("socket path %s: replacing a stale socket", path);
		unlink(name);
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		r = -errno;
		snprintf(why, len, "socket path %s: socket: %s", path, strerror(-r));
		return r;
	}
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", name);
	/* Nobody can connect before listen(); the mode is final at bind(). */
	old = umask(~mode & 0777);
	r = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (r < 0) {
		r = -errno;
		snprintf(why, len, "socket path %s: bind: %s", path, strerror(-r));
		close(fd);
		return r;
	}
	return fd;
}

/*
 * After bind: the entry name in dirfd must be a socket of our uid (the
 * one just bound: nobody else may change the directory); its group and,
 * where a default ACL on the directory overrode the umask, its mode are
 * set through an O_PATH descriptor of that very inode, never by name.
 * 0 or -errno with the reason in why.
 */
static int set_owner_and_mode(int dirfd, const char *path, const char *name, mode_t mode, gid_t gid,
			      char *why, size_t len)
{
	struct stat st;
	char proc[64];
	int pfd = openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC), r = 0;

	if (pfd < 0 || fstat(pfd, &st) < 0) {
		r = -errno;
		snprintf(why, len, "socket path %s: after bind: %s", path, strerror(-r));
	} else if (!S_ISSOCK(st.st_mode) || st.st_uid != geteuid()) {
		r = -EPERM;
		snprintf(why, len,
			 "socket path %s: replaced by a %s of uid %u right after bind; not "
			 "touching it",
			 path, td_file_type(st.st_mode), (unsigned)st.st_uid);
	} else if (gid != (gid_t)-1 && fchownat(pfd, "", (uid_t)-1, gid, AT_EMPTY_PATH) < 0) {
		r = -errno;
		snprintf(why, len, "socket path %s: setting group %u: %s", path, (unsigned)gid,
			 strerror(-r));
	} else if ((st.st_mode & 07777) != mode) {
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", pfd);
		if (chmod(proc, mode) < 0) {
			r = -errno;
			snprintf(why, len, "socket path %s: setting mode %03o: %s", path,
				 (unsigned)mode, strerror(-r));
		}
	}
	if (pfd >= 0)
		close(pfd);
	return r;
}

int server_socket_bind(const char *path, mode_t mode, gid_t gid, char *why, size_t len)
{
	struct bound_socket *b = NULL;
	char dir[TD_SOCKET_PATH_MAX];
	const char *name;
	int dirfd, cwd, fd, r;

	if (strlen(path) >= TD_SOCKET_PATH_MAX) {
		snprintf(why, len, "socket path %s: longer than %d bytes", path,
			 TD_SOCKET_PATH_MAX - 1);
		return -ENAMETOOLONG;
	}
	if (td_path_split(path, dir, sizeof(dir), &name) < 0) {
		snprintf(why, len, "socket path %s: does not end in a file name", path);
		return -EINVAL;
	}
	for (size_t i = 0; i < sizeof(bound) / sizeof(bound[0]) && !b; i++)
		if (!bound[i].used)
			b = &bound[i];
	if (!b) {
		snprintf(why, len, "socket path %s: too many sockets", path);
		return -EMFILE;
	}
	dirfd = open_socket_dir(path, dir, mode, why, len);
	if (dirfd < 0)
		return dirfd;
	/* bind() takes a path: bind the bare name from inside the pinned
	 * directory, then go back to where we were. */
	cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (cwd < 0 || fchdir(dirfd) < 0) {
		r = -errno;
		snprintf(why, len, "socket path %s: entering its directory: %s", path,
			 strerror(-r));
		if (cwd >= 0)
			close(cwd);
		close(dirfd);
		return r;
	}
	fd = bind_here(path, name, mode, why, len);
	if (fchdir(cwd) < 0)
		log_warn("socket path %s: returning to the working directory: %s", path,
			 strerror(errno));
	close(cwd);
	if (fd < 0) {
		close(dirfd);
		return fd;
	}
	r = set_owner_and_mode(dirfd, path, name, mode, gid, why, len);
	if (r < 0) {
		if (r != -EPERM)
			unlinkat(dirfd, name, 0);
		close(fd);
		close(dirfd);
		return r;
	}
	b->used = true;
	b->dirfd = dirfd;
	snprintf(b->path, sizeof(b->path), "%s", path);
	return fd;
}

void server_socket_remove(const char *path)
{
	for (size_t i = 0; i < sizeof(bound) / sizeof(bound[0]); i++) {
		struct bound_socket *b = &bound[i];
		const char *name = strrchr(b->path, '/');
		struct stat st;

		if (!b->used || strcmp(b->path, path) != 0)
			continue;
		name = name ? name + 1 : b->path;
		if (fstatat(b->dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(st.st_mode))
			unlinkat(b->dirfd, name, 0);
		close(b->dirfd);
		b->used = false;
		return;
	}
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

/* The listening socket at cfg's path. The fd, or -errno with the reason logged. */
static int bind_socket(const struct server_config *cfg)
{
	char why[600];
	int fd = server_socket_bind(cfg->socket_path, cfg->socket_mode, cfg->socket_gid, why,
				    sizeof(why));
	int r;

	if (fd < 0) {
		log_error("%s", why);
		return fd;
	}
	if (listen(fd, 512) < 0) {
		r = -errno;
		log_error("socket path %s: listen: %s", cfg->socket_path, strerror(-r));
		close(fd);
		server_socket_remove(cfg->socket_path);
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
	/* A socket bound through its directory (a daemon's stored one) names
	 * itself relatively: the path the daemon was given is then the one. */
	if (getsockname(fd, (struct sockaddr *)&sa, &len) == 0 && sa.sun_path[0] == '/')
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
	if (srv->listen_fd < 0)
		return;
	uv_poll_stop(&srv->listen_poll);
	uv_close((uv_handle_t *)&srv->listen_poll, NULL);
	close(srv->listen_fd);
	srv->listen_fd = -1;
	/* A passed socket belongs to the service manager, which listens on; a
	 * stored one is the next daemon's. */
	if (!srv->socket_inherited && !srv->socket_stored)
		server_socket_remove(srv->cfg.socket_path);
	if (srv->reserve_fd >= 0)
		close(srv->reserve_fd);
	srv->reserve_fd = -1;
}
