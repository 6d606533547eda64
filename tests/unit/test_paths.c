/*
 * common/paths.c: the socket path rule (TENSORD_SOCKET, XDG_RUNTIME_DIR,
 * /run/tensord for root, else a private directory under TENSORD_TMPDIR),
 * the client's candidates, the private directory check (a symlink, another
 * owner, a mode others may write refused) and TENSORD_DAEMON_UID.
 */
#include <errno.h>
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
		cmocka_unit_test_setup(test_daemon_uid, fresh),
	};
	char cmd[256];
	int r;

	snprintf(base, sizeof(base), "/tmp/tensord-paths-%d", (int)getpid());
	r = cmocka_run_group_tests(tests, NULL, NULL);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", base);
	return system(cmd) == 0 ? r : 1;
}
