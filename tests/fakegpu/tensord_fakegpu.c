/*
 * tensord with the fake CUDA driver and HIP runtime tables of the unit tests
 * (tests/unit/fake_gpu.h) in place of libcuda and libamdhip64: the whole
 * daemon, main.c included (built with main renamed tensord_main), serving
 * two fake devices "cuda:0" and "cuda:1". The integration tests use it to
 * drive GPU creates end to end on a machine without a GPU: the asynchronous
 * reply, a client that goes while its memory is allocated, a stop with an
 * allocation in flight, and the GPU memory stats report (NVML's fake counts
 * 300 MiB per primary context). Nothing is ever mapped: exported
 * descriptors are duplicates of stderr.
 *
 * Every free of device memory (cuMemFree, cuMemRelease, hipFree) writes
 * "fakegpu: <call> 0x<address or handle>" to stderr, the daemon's log, so a
 * test sees when the memory really went (test_gpu_quarantine.py).
 *
 * TENSORD_FAKE_ALLOC_MS: how long each cuMemCreate takes (default 0).
 */
#include <stdio.h>
#include <stdlib.h>

#include "gpu/cuda/nvml.h" /* before fake_gpu.h: its NVML fake too */
#include "../unit/fake_gpu.h"

int tensord_main(int argc, char **argv);

/* On the GPU worker: one write, so the line is never cut by the daemon's own. */
static void log_free(const char *fn, uint64_t key)
{
	fprintf(stderr, "fakegpu: %s 0x%llx\n", fn, (unsigned long long)key);
}

int main(int argc, char **argv)
{
	const char *ms = getenv("TENSORD_FAKE_ALLOC_MS");

	fake_gpu_install(2);
	fake_on_free = log_free;
	fake_alloc_delay_ms = ms ? (unsigned)strtoul(ms, NULL, 10) : 0;
	return tensord_main(argc, argv);
}
