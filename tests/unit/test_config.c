/*
 * daemon/config.c: what may be read as a config file (issue 18, item 16).
 * Only a regular file: /dev/zero, a FIFO (which would block) and a
 * directory are refused at once, by type. At most CONFIG_MAX_BYTES: a
 * bigger file is refused unread. A NUL byte is refused with its line. An
 * honest file, with or without a last newline, is applied line by line.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
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

#include "daemon/config.h"

static const struct option opts[] = {
	{ "mode", required_argument, NULL, 'm' },
	{ "socket", required_argument, NULL, 's' },
	{ NULL, 0, NULL, 0 },
};

static char dir[64], path[96], errpath[96];
static char err[4096];
static char applied[8192]; /* "key=value;" per line applied */

static int apply(const struct option *o, const char *value, void *ctx)
{
	size_t n = strlen(applied);

	snprintf(applied + n, sizeof(applied) - n, "%s=%s;", o->name, value);
	return 0;
}

/* config_load(p, required) with stderr captured in err. */
static int load(const char *p)
{
	int saved, fd, r;
	ssize_t len;

	applied[0] = '\0';
	fflush(stderr);
	saved = dup(STDERR_FILENO);
	fd = open(errpath, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(saved >= 0 && fd >= 0);
	dup2(fd, STDERR_FILENO);
	r = config_load(p, true, opts, apply, NULL);
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	len = pread(fd, err, sizeof(err) - 1, 0);
	err[len > 0 ? len : 0] = '\0';
	close(fd);
	return r;
}

static void write_bytes(const char *p, const void *buf, size_t len)
{
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, len), (ssize_t)len);
	close(fd);
}

static void test_honest_file(void **state)
{
	static const char text[] = "# c\n\n  mode = 0660 \nsocket=/x/y.sock";

	write_bytes(path, text, sizeof(text) - 1); /* no newline at the end */
	assert_int_equal(load(path), 0);
	assert_string_equal(applied, "mode=0660;socket=/x/y.sock;");
	assert_string_equal(err, "");
}

static void test_not_a_regular_file(void **state)
{
	char fifo[128];

	assert_int_equal(load("/dev/zero"), 2);
	assert_non_null(strstr(err, "config file /dev/zero: is a character device, not a regular "
				    "file"));
	assert_string_equal(applied, "");

	/* A FIFO nobody writes to: refused at once, not waited on. */
	snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	assert_int_equal(load(fifo), 2);
	assert_non_null(strstr(err, "is a FIFO, not a regular file"));

	assert_int_equal(load(dir), 2);
	assert_non_null(strstr(err, "is a directory, not a regular file"));
}

static void test_size_is_bounded(void **state)
{
	char *big = malloc(CONFIG_MAX_BYTES + 1);

	assert_non_null(big);
	/* Exactly the limit: comment lines, read and applied. */
	memset(big, '#', CONFIG_MAX_BYTES);
	memcpy(big, "mode = 0600\n", 12);
	big[CONFIG_MAX_BYTES - 1] = '\n';
	write_bytes(path, big, CONFIG_MAX_BYTES);
	assert_int_equal(load(path), 0);
	assert_string_equal(applied, "mode=0600;");
	/* One byte more: refused, nothing applied. */
	big[CONFIG_MAX_BYTES] = '\n';
	write_bytes(path, big, CONFIG_MAX_BYTES + 1);
	assert_int_equal(load(path), 2);
	assert_string_equal(applied, "");
	assert_non_null(strstr(err, "larger than the limit of 1048576 bytes"));
	assert_non_null(strstr(err, path));
	free(big);
}

static void test_nul_is_refused_with_its_line(void **state)
{
	static const char text[] = "mode = 0600\n# two\nsocket = /ok\0/evil\n";
	char want[160];

	write_bytes(path, text, sizeof(text) - 1);
	assert_int_equal(load(path), 2);
	snprintf(want, sizeof(want), "%s:3: contains a NUL byte", path);
	assert_non_null(strstr(err, want));
	/* Refused before any line is applied, so nothing is half-set. */
	assert_string_equal(applied, "");
}

static void test_missing(void **state)
{
	char p[128];

	snprintf(p, sizeof(p), "%s/none.conf", dir);
	assert_int_equal(config_load(p, false, opts, apply, NULL), 0);
	assert_int_equal(load(p), 2);
	assert_non_null(strstr(err, "No such file or directory"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_honest_file),
		cmocka_unit_test(test_not_a_regular_file),
		cmocka_unit_test(test_size_is_bounded),
		cmocka_unit_test(test_nul_is_refused_with_its_line),
		cmocka_unit_test(test_missing),
	};
	char cmd[128];
	int r;

	snprintf(dir, sizeof(dir), "/tmp/tensord-config-%d", (int)getpid());
	assert_int_equal(mkdir(dir, 0700), 0);
	snprintf(path, sizeof(path), "%s/tensord.conf", dir);
	snprintf(errpath, sizeof(errpath), "%s/stderr", dir);
	r = cmocka_run_group_tests(tests, NULL, NULL);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	return system(cmd) == 0 ? r : 1;
}
