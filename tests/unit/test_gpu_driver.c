/*
 * The loading every GPU driver shim shares (gpu/driver.[ch]), on the C
 * library instead of a driver: the first soname that opens, the reason
 * when none does, entry points by name or older name, a required one
 * missing, an optional group left all NULL when one of it is missing, and
 * the process-wide table: loaded once, replaced by a test's, in use.
 */
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "gpu/driver.h"

struct table {
	void *lib;
	size_t (*Strlen)(const char *s);
	int (*Abs)(int j);
	char *(*Strchr)(const char *s, int c);
	char *(*Strrchr)(const char *s, int c);
};

#define SYM(field, name, alt, group)                                                               \
	{                                                                                          \
		name, alt, offsetof(struct table, field), group                                    \
	}

static void test_dlopen_first_that_loads(void **state)
{
	const char *const none[] = { "libtensord-test-none.so.1", "libtensord-test-none.so.2",
				     NULL };
	const char *const some[] = { "libtensord-test-none.so.1", "libc.so.6", NULL };
	const char *name = NULL;
	char why[256] = "";
	void *lib;

	assert_null(td_gpu_dlopen(none, &name, why, sizeof(why)));
	assert_null(name);
	/* The last reason, naming the library. */
	assert_non_null(strstr(why, "libtensord-test-none.so.2"));
	lib = td_gpu_dlopen(some, &name, why, sizeof(why));
	assert_non_null(lib);
	assert_string_equal(name, "libc.so.6");
	dlclose(lib);
}

static void test_dlsym_required_alt_and_groups(void **state)
{
	const char *const libc[] = { "libc.so.6", NULL };
	const struct td_gpu_sym ok[] = {
		SYM(Strlen, "strlen", NULL, 0),
		SYM(Abs, "tensord_no_such_abs", "abs", 0), /* found by its older name */
		SYM(Strchr, "strchr", NULL, 1),
		SYM(Strrchr, "strrchr", NULL, 1),
	};
	const struct td_gpu_sym half[] = {
		SYM(Strlen, "strlen", NULL, 0), SYM(Strchr, "strchr", NULL, 1),
		SYM(Strrchr, "tensord_no_such_strrchr", NULL, 1), /* the group goes with it */
		SYM(Abs, "abs", NULL, 2),                         /* another group stays */
	};
	const struct td_gpu_sym required[] = {
		SYM(Strlen, "strlen", NULL, 0),
		SYM(Abs, "tensord_no_such_abs", NULL, 0),
	};
	struct table t;
	char why[256] = "";

	memset(&t, 0, sizeof(t));
	t.lib = td_gpu_dlopen(libc, NULL, why, sizeof(why));
	assert_non_null(t.lib);
	assert_int_equal(td_gpu_dlsym(t.lib, "libc.so.6", ok, 4, &t, "", why, sizeof(why)), 0);
	assert_int_equal(t.Strlen("four"), 4);
	assert_int_equal(t.Abs(-3), 3);
	assert_non_null(t.Strchr);
	assert_non_null(t.Strrchr);

	assert_int_equal(td_gpu_dlsym(t.lib, "libc.so.6", half, 4, &t, "", why, sizeof(why)), 0);
	assert_non_null(t.Strlen);
	assert_null(t.Strchr);
	assert_null(t.Strrchr);
	assert_non_null(t.Abs);

	assert_int_equal(
		td_gpu_dlsym(t.lib, "libc.so.6", required, 2, &t, " (too old)", why, sizeof(why)),
		-ENODEV);
	assert_string_equal(why, "libc.so.6: no symbol tensord_no_such_abs (too old)");
	dlclose(t.lib);
}

/* A driver whose load() counts its runs and fails or succeeds as told. */
static struct table loaded_table;
static struct td_gpu_driver drv = { .once = PTHREAD_ONCE_INIT, .table = &loaded_table };
static int loads;

static void load(void)
{
	loads++;
	drv.status = 0;
	drv.loaded = true;
}

static struct table failed_table;
static struct td_gpu_driver bad = { .once = PTHREAD_ONCE_INIT, .table = &failed_table };

static void load_bad(void)
{
	snprintf(bad.why, sizeof(bad.why), "libtest.so.1: cannot open");
	bad.status = -ENODEV;
}

static void test_driver_once_forced_in_use(void **state)
{
	struct table fake;
	const void *t = NULL;
	const char *why = NULL;

	/* A test's table: nothing is loaded, yet the driver counts as in use. */
	assert_false(td_gpu_driver_in_use(&drv));
	td_gpu_driver_use(&drv, &fake);
	assert_true(td_gpu_driver_in_use(&drv));
	assert_int_equal(td_gpu_driver_get(&drv, load, &t, &why), 0);
	assert_ptr_equal(t, &fake);
	assert_int_equal(loads, 0);
	td_gpu_driver_use(&drv, NULL);
	assert_false(td_gpu_driver_in_use(&drv));

	/* Loaded once, the same table every time. */
	assert_int_equal(td_gpu_driver_get(&drv, load, &t, &why), 0);
	assert_ptr_equal(t, &loaded_table);
	assert_int_equal(td_gpu_driver_get(&drv, load, &t, NULL), 0);
	assert_int_equal(loads, 1);
	assert_true(td_gpu_driver_in_use(&drv));

	/* A failure is the same answer every time, and nothing is in use. */
	t = NULL;
	assert_int_equal(td_gpu_driver_get(&bad, load_bad, &t, &why), -ENODEV);
	assert_string_equal(why, "libtest.so.1: cannot open");
	assert_null(t);
	assert_int_equal(td_gpu_driver_get(&bad, load_bad, &t, NULL), -ENODEV);
	assert_false(td_gpu_driver_in_use(&bad));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dlopen_first_that_loads),
		cmocka_unit_test(test_dlsym_required_alt_and_groups),
		cmocka_unit_test(test_driver_once_forced_in_use),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
