/*
 * Where the socket is, and whether a socket's directory and owner can be
 * trusted: the one rule the daemon and its clients share (paths.c;
 * docs/security.md says why each check is there).
 */
#ifndef TENSORD_PATHS_H
#define TENSORD_PATHS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
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

/* The same checks on an open descriptor of the directory (fstat): no race with a rename. */
int td_private_dir_checkat(int fd, const char *dir, uid_t owner, char *why, size_t len);

/*
 * The rule for a directory the daemon creates a file in (its socket, a
 * metrics socket, its log file), on st (the directory's fstat): owned by
 * root or by uid, and writable by nobody else unless it is sticky, as /tmp
 * is (then others may add names there but not rename or remove the
 * daemon's). Anyone else who may write there could swap the daemon's file
 * for a symbolic link between its creation and a chmod, chown or open by
 * name. 0, or -EPERM with the reason, naming dir, in why.
 */
int td_dir_rule(const struct stat *st, const char *dir, uid_t uid, char *why, size_t len);

/*
 * Opens dir to create files in as uid: O_PATH|O_DIRECTORY, symbolic links
 * on the way followed; the directory reached is the one checked with
 * td_dir_rule(), and the descriptor pins it, so a later rename of dir or
 * of a directory above it cannot redirect what is done through it. The
 * descriptor (close-on-exec), or -errno with the reason in why (-EPERM
 * when the directory breaks the rule).
 */
int td_dir_open(const char *dir, uid_t uid, char *why, size_t len);

/*
 * Splits path at its last '/': the directory ("." when there is none, "/"
 * for a name at the root) is written to dir, and *ret_name points at the
 * last component, inside path. 0; -EINVAL when that component is empty,
 * "." or ".."; -ENAMETOOLONG when the directory does not fit in dir_len.
 */
int td_path_split(const char *path, char *dir, size_t dir_len, const char **ret_name);

/* "regular file", "directory", "symbolic link", ... for st_mode, in messages. */
const char *td_file_type(mode_t mode);

/*
 * The uid a client trusts besides itself and root: $TENSORD_DAEMON_UID, a
 * number or a user name; (uid_t)-1 when unset or unknown.
 */
uid_t td_daemon_uid(void);

/* uid is this process's euid, root, or td_daemon_uid(). */
bool td_uid_trusted(uid_t uid);

#endif /* TENSORD_PATHS_H */
