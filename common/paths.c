/*
 * The socket path rule, shared by the daemon and its clients so that with
 * no settings at all they find each other, and the checks both make on a
 * socket's directory and owner (docs/security.md, "Finding the daemon").
 *
 *   daemon:  $TENSORD_SOCKET, else $XDG_RUNTIME_DIR/tensord.sock, else
 *            /run/tensord/tensord.sock for root, else the private directory
 *            $TENSORD_TMPDIR/tensord-UID/tensord.sock (TENSORD_TMPDIR: /tmp)
 *   client:  $TENSORD_SOCKET alone, else the daemon's path for its own uid,
 *            then /run/tensord/tensord.sock (a system service)
 */
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tensord/tensord.h>

#include "common/paths.h"

static int fits(int n, size_t len)
{
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

int td_private_dir(char *buf, size_t len, uid_t uid)
{
	const char *base = getenv("TENSORD_TMPDIR");

	if (!base || !*base)
		base = "/tmp";
	return fits(snprintf(buf, len, "%s/tensord-%u", base, (unsigned)uid), len);
}

int tensord_default_socket_path(char *buf, size_t len)
{
	const char *env = getenv("TENSORD_SOCKET");
	char dir[TD_SOCKET_PATH_MAX];

	if (env && *env)
		return fits(snprintf(buf, len, "%s", env), len);
	if ((env = getenv("XDG_RUNTIME_DIR")) && *env)
		return fits(snprintf(buf, len, "%s/tensord.sock", env), len);
	if (geteuid() == 0)
		return fits(snprintf(buf, len, "%s", TD_SYSTEM_SOCKET), len);
	if (td_private_dir(dir, sizeof(dir), geteuid()) < 0)
		return -ENAMETOOLONG;
	return fits(snprintf(buf, len, "%s/tensord.sock", dir), len);
}

int td_socket_candidates(struct td_socket_candidates *out)
{
	const char *env = getenv("TENSORD_SOCKET");
	int r;

	out->n = 0;
	r = tensord_default_socket_path(out->path[0], sizeof(out->path[0]));
	if (r < 0)
		return r;
	out->n = 1;
	if ((!env || !*env) && strcmp(out->path[0], TD_SYSTEM_SOCKET) != 0)
		snprintf(out->path[out->n++], sizeof(out->path[0]), "%s", TD_SYSTEM_SOCKET);
	return 0;
}

bool td_in_private_dir(const char *path, uid_t uid)
{
	char dir[TD_SOCKET_PATH_MAX];
	const char *slash = strrchr(path, '/');
	size_t n;

	if (!slash || td_private_dir(dir, sizeof(dir), uid) < 0)
		return false;
	n = (size_t)(slash - path);
	return n == strlen(dir) && strncmp(path, dir, n) == 0;
}

const char *td_file_type(mode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG:
		return "regular file";
	case S_IFDIR:
		return "directory";
	case S_IFLNK:
		return "symbolic link";
	case S_IFSOCK:
		return "socket";
	case S_IFIFO:
		return "FIFO";
	case S_IFCHR:
		return "character device";
	case S_IFBLK:
		return "block device";
	default:
		return "file of unknown type";
	}
}

/* The private directory checks on st (lstat or fstat of dir). */
static int private_dir_stat_check(const struct stat *st, const char *dir, uid_t owner, char *why,
				  size_t len)
{
	if (!S_ISDIR(st->st_mode))
		snprintf(why, len, "%s is not a directory but a %s", dir,
			 td_file_type(st->st_mode));
	else if (st->st_uid != owner)
		snprintf(why, len, "%s is owned by uid %u, not by uid %u", dir,
			 (unsigned)st->st_uid, (unsigned)owner);
	else if (st->st_mode & 022)
		snprintf(why, len, "%s has mode %04o: others may write in it", dir,
			 (unsigned)(st->st_mode & 07777));
	else
		return 0;
	return -EPERM;
}

int td_private_dir_check(const char *dir, uid_t owner, char *why, size_t len)
{
	struct stat st;

	if (lstat(dir, &st) < 0) {
		int e = errno;

		snprintf(why, len, "%s: %s", dir, strerror(e));
		return e == ENOENT ? -ENOENT : -EPERM;
	}
	return private_dir_stat_check(&st, dir, owner, why, len);
}

int td_private_dir_checkat(int fd, const char *dir, uid_t owner, char *why, size_t len)
{
	struct stat st;

	if (fstat(fd, &st) < 0) {
		snprintf(why, len, "%s: %s", dir, strerror(errno));
		return -EPERM;
	}
	return private_dir_stat_check(&st, dir, owner, why, len);
}

int td_dir_rule(const struct stat *st, const char *dir, uid_t uid, char *why, size_t len)
{
	if (!S_ISDIR(st->st_mode))
		snprintf(why, len, "%s is not a directory but a %s", dir,
			 td_file_type(st->st_mode));
	else if (st->st_uid != 0 && st->st_uid != uid)
		snprintf(why, len,
			 "%s is owned by uid %u, not by root or uid %u (the daemon's): its owner "
			 "could swap the daemon's files in it for symbolic links",
			 dir, (unsigned)st->st_uid, (unsigned)uid);
	else if ((st->st_mode & 022) && !(st->st_mode & S_ISVTX))
		snprintf(why, len,
			 "%s has mode %04o: others may write in it and it is not sticky, so they "
			 "could swap the daemon's files in it for symbolic links",
			 dir, (unsigned)(st->st_mode & 07777));
	else
		return 0;
	return -EPERM;
}

int td_dir_open(const char *dir, uid_t uid, char *why, size_t len)
{
	struct stat st;
	int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC), r;

	if (fd < 0) {
		r = -errno;
		snprintf(why, len, "%s: %s", dir, strerror(-r));
		return r;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		snprintf(why, len, "%s: %s", dir, strerror(-r));
	} else {
		r = td_dir_rule(&st, dir, uid, why, len);
	}
	if (r < 0) {
		close(fd);
		return r;
	}
	return fd;
}

int td_path_split(const char *path, char *dir, size_t dir_len, const char **ret_name)
{
	const char *slash = strrchr(path, '/');
	const char *name = slash ? slash + 1 : path;
	int n;

	if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return -EINVAL;
	if (!slash)
		n = snprintf(dir, dir_len, ".");
	else
		n = snprintf(dir, dir_len, "%.*s", slash == path ? 1 : (int)(slash - path), path);
	if (fits(n, dir_len) < 0)
		return -ENAMETOOLONG;
	*ret_name = name;
	return 0;
}

uid_t td_daemon_uid(void)
{
	const char *s = getenv("TENSORD_DAEMON_UID");
	struct passwd pw, *res = NULL;
	char buf[1024], *end;
	unsigned long v;

	if (!s || !*s)
		return (uid_t)-1;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (!*end && !errno && *s != '-')
		return (uid_t)v;
	if (getpwnam_r(s, &pw, buf, sizeof(buf), &res) == 0 && res)
		return res->pw_uid;
	return (uid_t)-1;
}

bool td_uid_trusted(uid_t uid)
{
	uid_t d = td_daemon_uid();

	return uid == geteuid() || uid == 0 || (d != (uid_t)-1 && uid == d);
}
