/*
 * Slabs (daemon/memory/slab.c) on real memfds: slot alignment and placement,
 * access classes kept apart, split and merge of free space, zeroing of a
 * freed slot before reuse, exhaustion into a second slab, closing an empty
 * one, and what a reader's descriptor cannot do.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/memory/slab.h"

static const struct slab_class A = { 1000, 1000, 0600 }, B = { 1000, 1000, 0644 };

static void test_alignment_and_classes(void **state)
{
	struct slabs s;
	struct slab *x, *y, *z;
	uint64_t ox, oy, oz;

	slabs_init(&s);
	assert_int_equal(slab_alloc(&s, &A, 0, &x, &ox), -EINVAL);
	assert_int_equal(slab_alloc(&s, &A, SLAB_MAX_ALLOC + 1, &x, &ox), -EINVAL);
	assert_int_equal(slab_alloc(&s, &A, 100, &x, &ox), 0);
	assert_int_equal(slab_alloc(&s, &A, 4096, &y, &oy), 0);
	assert_ptr_equal(x, y);
	assert_int_equal(ox % SLAB_ALIGN, 0);
	assert_int_equal(oy % SLAB_ALIGN, 0);
	assert_true(oy >= ox + 100);
	/* Another access class never shares a slab. */
	assert_int_equal(slab_alloc(&s, &B, 100, &z, &oz), 0);
	assert_ptr_not_equal(z, x);
	assert_int_not_equal(slab_id(z), slab_id(x));
	assert_int_equal(s.n_slabs, 2);
	assert_int_equal(s.used, 256 + 4096 + 256);
	slabs_fini(&s);
}

static void test_freed_slot_is_zeroed_and_reused(void **state)
{
	uint8_t data[5000], back[5000], zero[5000] = { 0 };
	struct slabs s;
	struct slab *x, *y, *keep;
	uint64_t ox, oy, ok;

	memset(data, 0xab, sizeof(data));
	slabs_init(&s);
	assert_int_equal(slab_alloc(&s, &A, 64, &keep, &ok), 0); /* keeps the slab open */
	assert_int_equal(slab_alloc(&s, &A, sizeof(data), &x, &ox), 0);
	assert_int_equal(slab_write(x, ox, data, sizeof(data)), 0);
	assert_int_equal(pread(slab_fd(x), back, sizeof(back), (off_t)ox), (ssize_t)sizeof(back));
	assert_memory_equal(back, data, sizeof(data));
	slab_free(&s, x, ox, sizeof(data));
	assert_int_equal(pread(slab_fd(keep), back, sizeof(back), (off_t)ox),
			 (ssize_t)sizeof(back));
	assert_memory_equal(back, zero, sizeof(zero));
	/* First fit: the freed space is merged and taken again, clean. */
	assert_int_equal(slab_alloc(&s, &A, 2 * sizeof(data), &y, &oy), 0);
	assert_ptr_equal(y, keep);
	assert_int_equal(oy, ox);
	assert_int_equal(pread(slab_fd(y), back, sizeof(back), (off_t)oy), (ssize_t)sizeof(back));
	assert_memory_equal(back, zero, sizeof(zero));
	slabs_fini(&s);
}

/* With the descriptor store on, a slot freed in a step keeps its bytes and
 * stays taken until the flush after the step's record (docs/restart.md). */
static void test_deferred_free_keeps_bytes_until_the_flush(void **state)
{
	uint8_t data[5000], back[5000], zero[5000] = { 0 };
	struct slabs s;
	struct slab *x, *y, *keep;
	uint64_t ox, oy, ok;

	memset(data, 0xcd, sizeof(data));
	slabs_init(&s);
	s.defer_frees = true;
	assert_int_equal(slab_alloc(&s, &A, 64, &keep, &ok), 0);
	assert_int_equal(slab_alloc(&s, &A, sizeof(data), &x, &ox), 0);
	assert_int_equal(slab_write(x, ox, data, sizeof(data)), 0);
	slab_free(&s, x, ox, sizeof(data));
	assert_int_equal(pread(slab_fd(keep), back, sizeof(back), (off_t)ox),
			 (ssize_t)sizeof(back));
	assert_memory_equal(back, data, sizeof(data));
	/* Not reused before the flush. */
	assert_int_equal(slab_alloc(&s, &A, sizeof(data), &y, &oy), 0);
	assert_int_not_equal(oy, ox);
	slab_free(&s, y, oy, sizeof(data));
	slabs_flush(&s);
	assert_int_equal(pread(slab_fd(keep), back, sizeof(back), (off_t)ox),
			 (ssize_t)sizeof(back));
	assert_memory_equal(back, zero, sizeof(zero));
	assert_int_equal(s.n_pending, 0);
	assert_int_equal(s.used, 256);
	slab_free(&s, keep, ok, 64);
	slabs_flush(&s);
	assert_int_equal(s.n_slabs, 0);
	slabs_fini(&s);
}

static void test_exhaustion_opens_a_second_slab_and_empty_ones_close(void **state)
{
	enum { N = SLAB_SIZE / SLAB_MAX_ALLOC };
	static struct slab *sl[N + 1];
	static uint64_t off[N + 1];
	struct slabs s;
	int first_fd;

	slabs_init(&s);
	for (int i = 0; i < N; i++)
		assert_int_equal(slab_alloc(&s, &A, SLAB_MAX_ALLOC, &sl[i], &off[i]), 0);
	assert_int_equal(s.n_slabs, 1);
	assert_int_equal(slab_alloc(&s, &A, SLAB_MAX_ALLOC, &sl[N], &off[N]), 0);
	assert_int_equal(s.n_slabs, 2);
	assert_ptr_not_equal(sl[N], sl[0]);
	first_fd = slab_fd(sl[0]);
	for (int i = 0; i < N; i++)
		slab_free(&s, sl[i], off[i], SLAB_MAX_ALLOC);
	assert_int_equal(s.n_slabs, 1);
	assert_int_equal(fcntl(first_fd, F_GETFD), -1); /* the empty slab was closed */
	slab_free(&s, sl[N], off[N], SLAB_MAX_ALLOC);
	assert_int_equal(s.n_slabs, 0);
	assert_int_equal(s.used, 0);
	slabs_fini(&s);
}

static void test_reader_descriptor_is_read_only(void **state)
{
	struct slabs s;
	struct slab *x;
	struct stat st;
	uint64_t ox;
	uint8_t b = 7;
	int fd;
	void *p;

	slabs_init(&s);
	assert_int_equal(slab_alloc(&s, &A, 64, &x, &ox), 0);
	assert_int_equal(slab_write(x, ox, &b, 1), 0);
	fd = slab_export(x);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, &b, 1, 0), -1);
	assert_int_equal(errno, EBADF);
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_ptr_equal(p, MAP_FAILED);
	p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
	assert_ptr_not_equal(p, MAP_FAILED);
	assert_int_equal(((uint8_t *)p)[ox], 7);
	munmap(p, 4096);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0400);
	close(fd);
	slabs_fini(&s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_alignment_and_classes),
		cmocka_unit_test(test_freed_slot_is_zeroed_and_reused),
		cmocka_unit_test(test_deferred_free_keeps_bytes_until_the_flush),
		cmocka_unit_test(test_exhaustion_opens_a_second_slab_and_empty_ones_close),
		cmocka_unit_test(test_reader_descriptor_is_read_only),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
