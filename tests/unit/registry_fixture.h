/*
 * The registry unit tests' fixture (test_registry, test_registry_async,
 * test_reserve, test_versions, test_quarantine), kept once: a registry made
 * fresh before each test and finished after it, the buffer its calls
 * explain a refusal in, and the arguments of a one-dimensional uint8
 * tensor, the shape those tests create. Each test file still names its
 * backends (the backends[] table) and resets its own counters in a setup
 * of its own that calls reg_fixture_setup(). Included by one test file
 * each (static definitions), after <cmocka.h>.
 */
#ifndef TENSORD_REGISTRY_FIXTURE_H
#define TENSORD_REGISTRY_FIXTURE_H

#include <stdint.h>
#include <string.h>

#include "daemon/registry/registry.h"

/* Where the registry says why it refused. */
__attribute__((unused)) static char why[512];

/*
 * Makes the test's registry with capacity bytes of host memory, its state
 * for cmocka, and returns it (the caller may set on_commit).
 */
__attribute__((unused)) static struct registry *reg_fixture_setup(void **state, uint64_t capacity)
{
	static struct registry reg;

	assert_int_equal(registry_init(&reg, capacity), 0);
	*state = &reg;
	return &reg;
}

/* cmocka's teardown: the registry of reg_fixture_setup() finished. */
__attribute__((unused)) static int reg_fixture_teardown(void **state)
{
	registry_fini(*state);
	return 0;
}

/* The arguments of a create of name, uint8, *n elements on device. */
__attribute__((unused)) static struct create_args reg_fixture_u8(const char *name, const int64_t *n,
								 DLDevice device)
{
	return (struct create_args){
		.name = name,
		.name_len = strlen(name),
		.dtype = { kDLUInt, 8, 1 },
		.ndim = 1,
		.shape = n,
		.device = device,
	};
}

#endif
