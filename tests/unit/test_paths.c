/*
 * common/paths.c: the socket path rule (TENSORD_SOCKET, XDG_RUNTIME_DIR,
 * /run/tensord for root, else a private directory under TENSORD_TMPDIR),
 * the client's candidates, the private directory check (a symlink, another
 * owner, a mode others may write refused), TENSORD_DAEMON_UID, and the
 * daemon's rule for a directory it creates files in (td_dir_rule:
 * root's or its own, closed to others unless sticky; issue 18, item 14).
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include <tensord/tensord.h>

#include "common/paths.h"

static char base[64];

static int fresh(void **state)
{
	char cmd[256];

	snprintf(cmd, sizeof(cmd), "rm -rf %s && mkdir -p %s", base, base);
	assert_int_equal(system(cmd), 0);
	unsetenv("TENSORD_SOCKET");
	unsetenv("XDG_RUNTIME_DIR");
	unsetenv("TENSORD_DAEMON_UID");
	setenv("TENSORD_TMPDIR", base, 1);
	return 0;
}

static void test_order(void **state)
{
	struct td_socket_candidates c;
	char want[128], dir[128];

	assert_int_equal(td_socket_candidates(&c), 0);
	if (geteuid() == 0) {
		assert_int_equal(c.n, 1);
		assert_string_equal(c.path[0], TD_SYSTEM_SOCKET);
	} else {
		snprintf(want, sizeof(want), "%s/tensord-%u/tensord.sock", base,
			 (unsigned)geteuid());
		assert_int_equal(c.n, 2);
		assert_string_equal(c.path[0], want);
		assert_string_equal(c.path[1], TD_SYSTEM_SOCKET);
		assert_true(td_in_private_dir(want, geteuid()));
	}
	assert_int_equal(td_private_dir(dir, sizeof(dir), 1234), 0);
	snprintf(want, sizeof(want), "%s/tensord-1234", base);
	assert_string_equal(dir, want);
	strcat(want, "/tensord.sock");
	assert_true(td_in_private_dir(want, 1234));
	assert_false(td_in_private_dir(want, 1235));
	assert_false(td_in_private_dir("/tmp/tensord-1234.sock", 1234));

	setenv("XDG_RUNTIME_DIR", "/run/user/77", 1);
	assert_int_equal(td_socket_candidates(&c), 0);
	assert_int_equal(c.n, 2);
	assert_string_equal(c.path[0], "/run/user/77/tensord.sock");
	assert_string_equal(c.path[1], TD_SYSTEM_SOCKET);

	/* An explicit socket is the only candidate. */
	setenv("TENSORD_SOCKET", "/x/y.sock", 1);
	assert_int_equal(td_socket_candidates(&c), 0);
	assert_int_equal(c.n, 1);
	assert_string_equal(c.path[0], "/x/y.sock");
	assert_int_equal(tensord_default_socket_path(want, 5), -ENAMETOOLONG);
}

static void test_private_dir_check(void **state)
{
	char dir[128], link[160], why[400];

	snprintf(dir, sizeof(dir), "%s/tensord-%u", base, (unsigned)geteuid());
	assert_int_equal(td_private_dir_check(dir, geteuid(), why, sizeof(why)), -ENOENT);
	assert_int_equal(mkdir(dir, 0700), 0);
	assert_int_equal(td_private_dir_check(dir, geteuid(), why, sizeof(why)), 0);
	assert_int_equal(chmod(dir, 0711), 0); /* search only: still private */
	assert_int_equal(td_private_dir_check(dir, geteuid(), why, sizeof(why)), 0);
	assert_int_equal(chmod(dir, 01777), 0);
	assert_int_equal(td_private_dir_check(dir, geteuid(), why, sizeof(why)), -EPERM);
	assert_non_null(strstr(why, "others may write"));
	assert_int_equal(chmod(dir, 0700), 0);
	assert_int_equal(td_private_dir_check(dir, geteuid() + 1, why, sizeof(why)), -EPERM);
	assert_non_null(strstr(why, "is owned by uid"));
	snprintf(link, sizeof(link), "%s/link", base);
	assert_int_equal(symlink(dir, link), 0);
	assert_int_equal(td_private_dir_check(link, geteuid(), why, sizeof(why)), -EPERM);
	assert_non_null(strstr(why, "symbolic link"));
}

static void test_path_split(void **state)
{
	char dir[16];
	const char *name;

	assert_int_equal(td_path_split("/a/b/c.sock", dir, sizeof(dir), &name), 0);
	assert_string_equal(dir, "/a/b");
	assert_string_equal(name, "c.sock");
	assert_int_equal(td_path_split("/c.sock", dir, sizeof(dir), &name), 0);
	assert_string_equal(dir, "/");
	assert_int_equal(td_path_split("c.sock", dir, sizeof(dir), &name), 0);
	assert_string_equal(dir, ".");
	assert_string_equal(name, "c.sock");
	assert_int_equal(td_path_split("/a/", dir, sizeof(dir), &name), -EINVAL);
	assert_int_equal(td_path_split("/a/..", dir, sizeof(dir), &name), -EINVAL);
	assert_int_equal(td_path_split(".", dir, sizeof(dir), &name), -EINVAL);
	assert_int_equal(td_path_split("", dir, sizeof(dir), &name), -EINVAL);
	assert_int_equal(td_path_split("/a-very-long-directory/x", dir, sizeof(dir), &name),
			 -ENAMETOOLONG);
}

/* The rule on a made-up stat: the owner and the mode decide. */
static int rule(uid_t owner, mode_t mode, uid_t me, char *why, size_t len)
{
	struct stat st = { .st_mode = mode, .st_uid = owner };

	return td_dir_rule(&st, "/d", me, why, len);
}

static void test_dir_rule(void **state)
{
	char why[400];

	/* Root's or ours, closed to others: safe. */
	assert_int_equal(rule(0, S_IFDIR | 0755, 1000, why, sizeof(why)), 0);
	assert_int_equal(rule(1000, S_IFDIR | 0700, 1000, why, sizeof(why)), 0);
	assert_int_equal(rule(0, S_IFDIR | 0755, 0, why, sizeof(why)), 0);
	/* Sticky and open to all, as /tmp: others cannot rename ours away. */
	assert_int_equal(rule(0, S_IFDIR | 01777, 0, why, sizeof(why)), 0);
	assert_int_equal(rule(1000, S_IFDIR | 01777, 1000, why, sizeof(why)), 0);
	/* Another uid's directory, even closed, even sticky: its owner may swap. */
	assert_int_equal(rule(1001, S_IFDIR | 0755, 0, why, sizeof(why)), -EPERM);
	assert_string_equal(why,
			    "/d is owned by uid 1001, not by root or uid 0 (the daemon's): "
			    "its owner could swap the daemon's files in it for symbolic links");
	assert_int_equal(rule(1001, S_IFDIR | 01777, 1000, why, sizeof(why)), -EPERM);
	/* Writable by group or others and not sticky. */
	assert_int_equal(rule(0, S_IFDIR | 0777, 0, why, sizeof(why)), -EPERM);
	assert_non_null(strstr(why, "/d has mode 0777: others may write in it and it is not "
				    "sticky"));
	assert_int_equal(rule(0, S_IFDIR | 0775, 0, why, sizeof(why)), -EPERM);
	assert_int_equal(rule(1000, S_IFDIR | 0757, 1000, why, sizeof(why)), -EPERM);
	assert_int_equal(rule(0, S_IFREG | 0644, 0, why, sizeof(why)), -EPERM);
	assert_non_null(strstr(why, "not a directory but a regular file"));
}

static void test_dir_open(void **state)
{
	char dir[128], link[160], why[400];
	struct stat a, b;
	int fd;

	snprintf(dir, sizeof(dir), "%s/d", base);
	assert_int_equal(td_dir_open(dir, geteuid(), why, sizeof(why)), -ENOENT);
	assert_non_null(strstr(why, dir));
	assert_int_equal(mkdir(dir, 0755), 0);
	fd = td_dir_open(dir, geteuid(), why, sizeof(why));
	assert_true(fd >= 0);
	/* It pins the directory: renamed away, the descriptor still names it. */
	snprintf(link, sizeof(link), "%s/moved", base);
	assert_int_equal(rename(dir, link), 0);
	assert_int_equal(fstat(fd, &a), 0);
	assert_int_equal(stat(link, &b), 0);
	assert_true(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	close(fd);
	/* A link on the way is followed: the directory reached is checked. */
	assert_int_equal(symlink(link, dir), 0);
	fd = td_dir_open(dir, geteuid(), why, sizeof(why));
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(chmod(link, 0777), 0);
	assert_int_equal(td_dir_open(dir, geteuid(), why, sizeof(why)), -EPERM);
	assert_non_null(strstr(why, "others may write in it and it is not sticky"));
	assert_int_equal(chmod(link, 01777), 0);
	fd = td_dir_open(dir, geteuid(), why, sizeof(why));
	assert_true(fd >= 0);
	close(fd);
	/* The private directory check on a descriptor sees the same. */
	fd = open(link, O_RDONLY | O_DIRECTORY);
	assert_int_equal(td_private_dir_checkat(fd, link, geteuid(), why, sizeof(why)), -EPERM);
	assert_non_null(strstr(why, "others may write"));
	assert_int_equal(fchmod(fd, 0700), 0);
	assert_int_equal(td_private_dir_checkat(fd, link, geteuid(), why, sizeof(why)), 0);
	close(fd);
}

static void test_daemon_uid(void **state)
{
	uid_t other = geteuid() + 4242;
	char s[16];

	assert_int_equal(td_daemon_uid(), (uid_t)-1);
	assert_true(td_uid_trusted(0));
	assert_true(td_uid_trusted(geteuid()));
	assert_false(td_uid_trusted(other));
	snprintf(s, sizeof(s), "%u", (unsigned)other);
	setenv("TENSORD_DAEMON_UID", s, 1);
	assert_int_equal(td_daemon_uid(), other);
	assert_true(td_uid_trusted(other));
	setenv("TENSORD_DAEMON_UID", "root", 1);
	assert_int_equal(td_daemon_uid(), 0);
	setenv("TENSORD_DAEMON_UID", "no-such-user-tensord", 1);
	assert_int_equal(td_daemon_uid(), (uid_t)-1);
	setenv("TENSORD_DAEMON_UID", "-1", 1);
	assert_int_equal(td_daemon_uid(), (uid_t)-1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_order, fresh),
		cmocka_unit_test_setup(test_private_dir_check, fresh),
		cmocka_unit_test_setup(test_path_split, fresh),
		cmocka_unit_test_setup(test_dir_rule, fresh),
		cmocka_unit_test_setup(test_dir_open, fresh),
		cmocka_unit_test_setup(test_daemon_uid, fresh),
	};
	char cmd[256];
	int r;

	snprintf(base, sizeof(base), "/tmp/tensord-paths-%d", (int)getpid());
	r = cmocka_run_group_tests(tests, NULL, NULL);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", base);
	return system(cmd) == 0 ? r : 1;
}
