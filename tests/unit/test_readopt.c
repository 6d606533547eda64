/*
 * The restart hold (registry_readopt.c, docs/restart.md section 5): a
 * restored tensor is held until the grace period ends, a client that may
 * read it re-adopts a lease on it by name and generation, also after its
 * name went, and the end frees what nobody holds and nobody names.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/registry/registry.h"
#include "daemon/registry/registry_int.h"
#include "registry_fixture.h"

const struct backend_ops *const backends[] = { &backend_host, NULL };

static int setup(void **state)
{
	reg_fixture_setup(state, 1 << 20);
	return 0;
}

/* Restores name at generation g (owner 1000:100, mode) in a memfd of its own. */
static struct tensor *restore(struct registry *reg, const char *name, uint64_t g, uint32_t mode)
{
	int64_t shape = 64, strides = 1;
	struct reg_restore r = {
		.name = name,
		.name_len = strlen(name),
		.dtype = { kDLUInt, 8, 1 },
		.ndim = 1,
		.shape = &shape,
		.strides = &strides,
		.nbytes = 64,
		.uid = 1000,
		.gid = 100,
		.mode = mode,
		.generation = g,
		.commit = g,
	};
	int fd = memfd_create("restored", MFD_CLOEXEC);
	uint8_t uuid[16] = { 0 };
	struct reg_arena *a;

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, 4096), 0);
	a = registry_restore_memory(reg, kDLCPU, uuid, fd, 4096, 1000, 100, mode, why, sizeof(why));
	assert_non_null(a);
	assert_int_equal(registry_restore_tensor(reg, a, &r, why, sizeof(why)), 0);
	registry_restore_memory_done(reg, a);
	return reg_find_named(reg, name, strlen(name));
}

static void test_readopt_by_name_and_generation(void **state)
{
	struct registry *reg = *state;
	struct reg_client owner, group, other;
	struct tensor *t = restore(reg, "w", 7, 0640);
	uint64_t l = 0;

	registry_client_init(&owner, 1, 1000, 100, 1);
	registry_client_init(&group, 2, 1001, 100, 2);
	registry_client_init(&other, 3, 1002, 200, 3);
	assert_non_null(t);
	assert_int_equal(reg->n_held, 1);
	assert_int_equal(t->refcount, 1); /* the hold */
	assert_int_equal(registry_readopt(reg, &owner, "w", 6, &l), -ENOENT);
	assert_int_equal(registry_readopt(reg, &owner, "v", 7, &l), -ENOENT);
	assert_int_equal(registry_readopt(reg, &other, "w", 7, &l), -EACCES);
	assert_int_equal(registry_readopt(reg, &group, "w", 7, &l), 0);
	assert_ptr_equal(registry_lease_tensor(&group, l), t);
	assert_int_equal(registry_readopt(reg, &owner, "w", 7, &l), 0);
	assert_int_equal(t->refcount, 3);
	assert_int_equal(reg->readopted, 2);
	assert_int_equal(registry_release(reg, &owner, l), 0);
	registry_readopt_end(reg);
	assert_int_equal(reg->n_held, 0);
	assert_int_equal(t->refcount, 1); /* group's lease */
	/* Over: nothing more is re-adopted. */
	assert_int_equal(registry_readopt(reg, &owner, "w", 7, &l), -ENOENT);
	registry_client_gone(reg, &owner);
	registry_client_gone(reg, &group);
	registry_client_gone(reg, &other);
}

static void test_the_hold_keeps_a_version_whose_name_went(void **state)
{
	struct registry *reg = *state;
	struct reg_client owner;
	struct tensor *kept = restore(reg, "kept", 3, 0600);
	struct tensor *gone = restore(reg, "gone", 5, 0600);
	uint64_t l = 0;

	registry_client_init(&owner, 1, 1000, 100, 1);
	assert_int_equal(reg->n_tensors, 2);
	assert_int_equal(registry_unlink(reg, &owner, "kept", 4, why, sizeof(why)), 0);
	assert_int_equal(registry_unlink(reg, &owner, "gone", 4, why, sizeof(why)), 0);
	/* Unnamed, both still held: a holder from before re-adopts one. */
	assert_int_equal(reg->n_tensors, 2);
	assert_int_equal(kept->state, TENSORD_STATE_UNLINKED);
	assert_int_equal(registry_readopt(reg, &owner, "kept", 3, &l), 0);
	registry_readopt_end(reg);
	/* The one nobody re-adopted is freed at the end; the other when released. */
	assert_int_equal(reg->held_freed, 1);
	assert_int_equal(reg->n_tensors, 1);
	(void)gone;
	assert_int_equal(registry_release(reg, &owner, l), 0);
	assert_int_equal(reg->n_tensors, 0);
	registry_client_gone(reg, &owner);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_readopt_by_name_and_generation, setup,
						reg_fixture_teardown),
		cmocka_unit_test_setup_teardown(test_the_hold_keeps_a_version_whose_name_went,
						setup, reg_fixture_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
