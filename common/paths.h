/*
 * Where the socket is, and whether a socket's directory and owner can be
 * trusted: the one rule the daemon and its clients share (paths.c;
 * docs/security.md says why each check is there).
 */
#ifndef TENSORD_PATHS_H
#define TENSORD_PATHS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define TD_SOCKET_PATH_MAX 108 /* sizeof(sun_path) */
#define TD_SYSTEM_SOCKET "/run/tensord/tensord.sock"

/* Where a client with no explicit socket looks, in order. */
struct td_socket_candidates {
	int n;
	char path[2][TD_SOCKET_PATH_MAX];
};

/* 0, or -ENAMETOOLONG when a path does not fit. */
int td_socket_candidates(struct td_socket_candidates *out);

/*
 * This uid's private socket directory: $TENSORD_TMPDIR (default /tmp)
 * followed by /tensord-UID. 0 or -ENAMETOOLONG.
 */
int td_private_dir(char *buf, size_t len, uid_t uid);

/* Whether path's directory is td_private_dir() of uid. */
bool td_in_private_dir(const char *path, uid_t uid);

/*
 * Checks dir as a private socket directory of owner: lstat (a symlink is
 * refused), a directory, owned by owner, writable by nobody else. 0, or
 * -ENOENT when missing, or -EPERM with the reason written to why.
 */
int td_private_dir_check(const char *dir, uid_t owner, char *why, size_t len);

/*
 * The uid a client trusts besides itself and root: $TENSORD_DAEMON_UID, a
 * number or a user name; (uid_t)-1 when unset or unknown.
 */
uid_t td_daemon_uid(void);

/* uid is this process's euid, root, or td_daemon_uid(). */
bool td_uid_trusted(uid_t uid);

#endif /* TENSORD_PATHS_H */
