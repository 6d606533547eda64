/*
 * memlimit_cgroup() over fake /proc and /sys trees: cgroup v2, v1 with the
 * memory controller alone or in a list, "max", the smallest limit along the
 * path winning, and no cgroup file at all; memlimit_shmem() reads the
 * daemon's own cgroup's shmem, v2 and v1.
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

#include "daemon/memory/memlimit.h"

static char root[64];

static void put_file(const char *rel, const char *text)
{
	char path[512], dir[1024];

	snprintf(path, sizeof(path), "%s%s", root, rel);
	snprintf(dir, sizeof(dir), "mkdir -p \"$(dirname '%s')\"", path);
	assert_int_equal(system(dir), 0);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static int fresh(void **state)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
	assert_int_equal(system(cmd), 0);
	return 0;
}

static void test_v2_smallest_along_the_path(void **state)
{
	put_file("/proc/self/cgroup", "0::/system.slice/tensord.service\n");
	put_file("/sys/fs/cgroup/memory.max", "max\n");
	put_file("/sys/fs/cgroup/system.slice/memory.max", "8589934592\n");
	put_file("/sys/fs/cgroup/system.slice/tensord.service/memory.max", "max\n");
	assert_int_equal(memlimit_cgroup(root), 8589934592ull);
	put_file("/sys/fs/cgroup/system.slice/tensord.service/memory.max", "1073741824\n");
	assert_int_equal(memlimit_cgroup(root), 1073741824ull);
}

static void test_v1_memory_controller(void **state)
{
	put_file("/proc/self/cgroup",
		 "9:name=systemd:/\n5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n");
	put_file("/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
	put_file("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "536870912\n");
	assert_int_equal(memlimit_cgroup(root), 536870912ull);
	put_file("/proc/self/cgroup", "4:cpu,memory:/docker/abc\n");
	assert_int_equal(memlimit_cgroup(root), 536870912ull);
}

static void test_no_limit(void **state)
{
	assert_int_equal(memlimit_cgroup(root), UINT64_MAX); /* no /proc/self/cgroup */
	put_file("/proc/self/cgroup", "0::/\n");
	put_file("/sys/fs/cgroup/memory.max", "max\n");
	assert_int_equal(memlimit_cgroup(root), UINT64_MAX);
	put_file("/proc/self/cgroup", "garbage\n4:cpu:/y\n");
	assert_int_equal(memlimit_cgroup(root), UINT64_MAX);
	/* The real system answers something, and never more than physical memory. */
	assert_true(memlimit_bytes() > 0);
	assert_true(memlimit_bytes() <=
		    (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE));
}

static void test_shmem_of_its_own_cgroup(void **state)
{
	assert_int_equal(memlimit_shmem(root), UINT64_MAX); /* no /proc/self/cgroup */
	put_file("/proc/self/cgroup", "0::/system.slice/tensord.service\n");
	put_file("/sys/fs/cgroup/memory.stat", "anon 1\nshmem 999\n");
	assert_int_equal(memlimit_shmem(root), UINT64_MAX); /* not the parent's */
	put_file("/sys/fs/cgroup/system.slice/tensord.service/memory.stat",
		 "anon 5\nfile 7\nshmem 1048576\nshmem_thp 0\n");
	assert_int_equal(memlimit_shmem(root), 1048576ull);
	put_file("/proc/self/cgroup", "9:name=systemd:/\n4:memory:/docker/abc\n0::/\n");
	put_file("/sys/fs/cgroup/memory/docker/abc/memory.stat",
		 "cache 10\nshmem 4096\ntotal_shmem 8192\n");
	assert_int_equal(memlimit_shmem(root), 4096ull);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_v2_smallest_along_the_path, fresh),
		cmocka_unit_test_setup(test_v1_memory_controller, fresh),
		cmocka_unit_test_setup(test_no_limit, fresh),
		cmocka_unit_test_setup(test_shmem_of_its_own_cgroup, fresh),
	};

	snprintf(root, sizeof(root), "/tmp/tensord-memlimit-%d", (int)getpid());
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	fresh(NULL);
	return r;
}
