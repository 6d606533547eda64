/*
 * libtensord: finding the daemon and checking who serves it, before a
 * single byte is sent. For each candidate path (common/paths.c): the
 * directory and the socket must belong to this uid, root or the configured
 * daemon uid ($TENSORD_DAEMON_UID), a private /tmp directory must be ours
 * and closed to others, and after connect() the peer's uid from
 * SO_PEERCRED must be one of the same. Each failure is worded for what it
 * is: no daemon (-ECONNREFUSED), no permission (-EACCES), someone else's
 * socket (-EPERM). docs/security.md says what each check protects.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "client.h"
#include "common/paths.h"

/* try_path() found nothing serving this path; try the next one. */
#define ABSENT 1

static int permission_error(const char *path)
{
	return td_set_error(-EACCES,
			    "permission denied on %s: the daemon must be started with --mode 0660 "
			    "--group G for a group G of uid %u (or --mode 0666), and the socket's "
			    "directory must be open to that uid",
			    path, (unsigned)geteuid());
}

/* what is "is owned by" or "is served by pid P of". */
static int untrusted_owner(const char *path, const char *what, uid_t uid)
{
	return td_set_error(-EPERM,
			    "%s %s uid %u, not by you (uid %u), root or the daemon uid: remove it "
			    "if it is not yours, or set TENSORD_DAEMON_UID=%u to trust that user",
			    path, what, (unsigned)uid, (unsigned)geteuid(), (unsigned)uid);
}

/* The directory that holds path. 0, ABSENT, or -errno with the error set. */
static int check_dir(const char *path)
{
	char dir[TD_SOCKET_PATH_MAX], why[400];
	const char *slash = strrchr(path, '/');
	struct stat st;
	int r;

	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else
		snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path);
	if (td_in_private_dir(path, geteuid())) {
		r = td_private_dir_check(dir, geteuid(), why, sizeof(why));
		if (r == -ENOENT)
			return ABSENT;
		if (r < 0)
			return td_set_error(-EPERM,
					    "refusing %s: %s; someone else may be squatting "
					    "it: remove it and restart tensord",
					    path, why);
		return 0;
	}
	if (stat(dir, &st) < 0)
		return errno == EACCES ? permission_error(path) : ABSENT;
	if (!td_uid_trusted(st.st_uid))
		return untrusted_owner(dir, "is owned by", st.st_uid);
	return 0;
}

/* The socket inode. 0, ABSENT, or -errno with the error set. */
static int check_socket(const char *path)
{
	struct stat st;

	if (lstat(path, &st) < 0)
		return errno == EACCES ? permission_error(path) : ABSENT;
	if (S_ISDIR(st.st_mode))
		return td_set_error(-ENOTSOCK,
				    "%s is a directory, not a socket (name the socket itself, "
				    "such as %s/tensord.sock)",
				    path, path);
	if (!S_ISSOCK(st.st_mode))
		return td_set_error(
			-ENOTSOCK,
			"%s is not a socket but a %s; is TENSORD_SOCKET or --socket right?", path,
			S_ISREG(st.st_mode) ? "regular file" : "special file");
	if (!td_uid_trusted(st.st_uid))
		return untrusted_owner(path, "is owned by", st.st_uid);
	return 0;
}

/* Connects fd to path and checks the peer. 0, ABSENT, or -errno with the error set. */
static int connect_checked(int fd, const char *path, char *absent, size_t len)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct ucred cred;
	socklen_t clen = sizeof(cred);

	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;

		if (e == EACCES)
			return permission_error(path);
		if (e == ENOENT || e == ECONNREFUSED) {
			snprintf(absent, len, "%s", strerror(e));
			return ABSENT;
		}
		return td_set_error(-e, "cannot connect to tensord at %s: %s", path, strerror(e));
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0)
		return td_set_error(-errno, "%s: SO_PEERCRED: %s", path, strerror(errno));
	if (!td_uid_trusted(cred.uid)) {
		char what[64];

		snprintf(what, sizeof(what), "is served by pid %d of", (int)cred.pid);
		return untrusted_owner(path, what, cred.uid);
	}
	return 0;
}

/* One candidate: a connected, checked descriptor, ABSENT, or -errno with the error set. */
static int try_path(const char *path, char *absent, size_t len)
{
	int fd, r;

	snprintf(absent, len, "%s", strerror(ENOENT));
	r = check_dir(path);
	if (r == 0)
		r = check_socket(path);
	if (r != 0)
		return r;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return td_set_error(-errno, "socket: %s", strerror(errno));
	r = connect_checked(fd, path, absent, len);
	if (r != 0) {
		close(fd);
		return r;
	}
	return fd;
}

int td_connect_socket(const char *socket_path, char *ret_path, size_t len)
{
	struct td_socket_candidates cand;
	char absent[128];
	int r;

	if (socket_path) {
		if (strlen(socket_path) >= sizeof(cand.path[0]))
			return td_set_error(-ENAMETOOLONG, "socket path %s is too long",
					    socket_path);
		cand.n = 1;
		snprintf(cand.path[0], sizeof(cand.path[0]), "%s", socket_path);
	} else if (td_socket_candidates(&cand) < 0) {
		return td_set_error(-ENAMETOOLONG, "default socket path is too long");
	}
	for (int i = 0; i < cand.n; i++) {
		r = try_path(cand.path[i], absent, sizeof(absent));
		if (r != ABSENT) {
			snprintf(ret_path, len, "%s", cand.path[i]);
			return r;
		}
	}
	snprintf(ret_path, len, "%s", cand.path[0]);
	if (cand.n == 1)
		return td_set_error(-ECONNREFUSED, "no tensord at %s: %s", cand.path[0], absent);
	return td_set_error(-ECONNREFUSED,
			    "no tensord at %s (tried %s, %s): start tensord, or set TENSORD_SOCKET",
			    cand.path[0], cand.path[0], cand.path[1]);
}
