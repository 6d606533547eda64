/*
 * daemon/base/log.c, log_open(): the log file is a name another user may plant
 * (issue 18, item 15). A symbolic link is not followed, a FIFO, a device
 * or a directory is refused (without blocking), a file with another name
 * (hard link) or of another owner is refused, and so is a directory that
 * breaks td_dir_rule(); the target of a planted link is never written. An
 * honest file is appended to, and reopened after a rotation.
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

#include "daemon/base/log.h"

static char dir[64], why[600];
static int saved_stderr = -1;

static int fresh(void **state)
{
	char cmd[160];

	snprintf(cmd, sizeof(cmd), "rm -rf %s && mkdir -m 0755 %s", dir, dir);
	assert_int_equal(system(cmd), 0);
	why[0] = '\0';
	return 0;
}

/* log_open() sends stderr to the file: give cmocka its stderr back. */
static int restore(void **state)
{
	fflush(stderr);
	dup2(saved_stderr, STDERR_FILENO);
	return 0;
}

static void in_dir(char *buf, size_t len, const char *name)
{
	snprintf(buf, len, "%s/%s", dir, name);
}

static off_t size_of(const char *p)
{
	struct stat st;

	assert_int_equal(stat(p, &st), 0);
	return st.st_size;
}

static void test_honest_file_is_appended_and_reopened(void **state)
{
	char p[128], moved[140];

	in_dir(p, sizeof(p), "tensord.log");
	assert_int_equal(log_open(p, why, sizeof(why)), 0);
	log_write(TD_LOG_INFO, "first");
	assert_true(size_of(p) > 0);
	snprintf(moved, sizeof(moved), "%s.1", p);
	assert_int_equal(rename(p, moved), 0); /* a rotation */
	assert_int_equal(log_reopen(), 0);
	log_write(TD_LOG_INFO, "second");
	assert_true(size_of(p) > 0);
}

static void test_planted_symlink_is_not_followed(void **state)
{
	char p[128], target[128];
	static const char secret[] = "root:x:0:0\n";
	struct stat before, after;
	FILE *f;

	in_dir(target, sizeof(target), "target");
	f = fopen(target, "w");
	assert_non_null(f);
	fputs(secret, f);
	fclose(f);
	assert_int_equal(chmod(target, 0600), 0);
	assert_int_equal(stat(target, &before), 0);
	in_dir(p, sizeof(p), "tensord.log");
	assert_int_equal(symlink(target, p), 0);
	assert_int_equal(log_open(p, why, sizeof(why)), -ELOOP);
	assert_non_null(strstr(why, "symbolic link, not a regular file"));
	assert_int_equal(stat(target, &after), 0);
	assert_int_equal(after.st_size, sizeof(secret) - 1);
	assert_int_equal(after.st_mode, before.st_mode);
	/* A dangling one is not followed to create its target either. */
	assert_int_equal(unlink(p), 0);
	in_dir(target, sizeof(target), "created-through-link");
	assert_int_equal(symlink(target, p), 0);
	assert_int_equal(log_open(p, why, sizeof(why)), -ELOOP);
	assert_int_equal(access(target, F_OK), -1);
}

static void test_not_a_regular_file(void **state)
{
	char p[128];

	/* A FIFO nobody reads: refused at once, never blocked on. */
	in_dir(p, sizeof(p), "fifo");
	assert_int_equal(mkfifo(p, 0600), 0);
	assert_true(log_open(p, why, sizeof(why)) < 0);
	assert_non_null(strstr(why, "is a FIFO, not a regular file"));
	assert_true(log_open("/dev/null", why, sizeof(why)) < 0);
	assert_non_null(strstr(why, "is a character device, not a regular file"));
	in_dir(p, sizeof(p), "sub");
	assert_int_equal(mkdir(p, 0700), 0);
	assert_true(log_open(p, why, sizeof(why)) < 0);
	assert_non_null(strstr(why, "is a directory"));
	assert_int_equal(log_open(dir, why, sizeof(why)) < 0, 1);
}

static void test_second_name_is_refused(void **state)
{
	char p[128], other[128];

	in_dir(other, sizeof(other), "other");
	assert_int_equal(close(open(other, O_WRONLY | O_CREAT, 0600)), 0);
	in_dir(p, sizeof(p), "tensord.log");
	assert_int_equal(link(other, p), 0);
	assert_int_equal(log_open(p, why, sizeof(why)), -EPERM);
	assert_non_null(strstr(why, "has 2 hard links"));
	assert_int_equal(size_of(other), 0);
}

static void test_directory_rule(void **state)
{
	char sub[128], p[160];

	in_dir(sub, sizeof(sub), "open");
	assert_int_equal(mkdir(sub, 0700), 0);
	assert_int_equal(chmod(sub, 0777), 0); /* others may swap names in it */
	snprintf(p, sizeof(p), "%s/tensord.log", sub);
	assert_int_equal(log_open(p, why, sizeof(why)), -EPERM);
	assert_non_null(strstr(why, "refusing its directory"));
	assert_non_null(strstr(why, "not sticky"));
	assert_int_equal(access(p, F_OK), -1);
	/* Sticky, as /tmp: others cannot rename or remove our file there. */
	assert_int_equal(chmod(sub, 01777), 0);
	assert_int_equal(log_open(p, why, sizeof(why)), 0);
}

static void test_other_owner_is_refused(void **state)
{
	char p[128];

	if (geteuid() != 0) {
		print_message("skipped: needs root to make a file of another uid\n");
		skip();
	}
	in_dir(p, sizeof(p), "planted.log");
	assert_int_equal(close(open(p, O_WRONLY | O_CREAT, 0666)), 0);
	assert_int_equal(chown(p, 4242, 4242), 0);
	assert_int_equal(log_open(p, why, sizeof(why)), -EPERM);
	assert_non_null(strstr(why, "owned by uid 4242, not by root or uid 0"));
	assert_int_equal(size_of(p), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_honest_file_is_appended_and_reopened, fresh,
						restore),
		cmocka_unit_test_setup_teardown(test_planted_symlink_is_not_followed, fresh,
						restore),
		cmocka_unit_test_setup_teardown(test_not_a_regular_file, fresh, restore),
		cmocka_unit_test_setup_teardown(test_second_name_is_refused, fresh, restore),
		cmocka_unit_test_setup_teardown(test_directory_rule, fresh, restore),
		cmocka_unit_test_setup_teardown(test_other_owner_is_refused, fresh, restore),
	};
	char cmd[128];
	int r;

	saved_stderr = dup(STDERR_FILENO);
	snprintf(dir, sizeof(dir), "/tmp/tensord-log-%d", (int)getpid());
	r = cmocka_run_group_tests(tests, NULL, NULL);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	return system(cmd) == 0 ? r : 1;
}
