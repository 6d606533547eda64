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
 * TENSORD_FAKE_ALLOC_MS: how long each cuMemCreate takes (default 0).
 */
#include <stdlib.h>

#include "gpu/cuda/nvml.h" /* before fake_gpu.h: its NVML fake too */
#include "../unit/fake_gpu.h"

int tensord_main(int argc, char **argv);

int main(int argc, char **argv)
{
	const char *ms = getenv("TENSORD_FAKE_ALLOC_MS");

	fake_gpu_install(2);
	fake_alloc_delay_ms = ms ? (unsigned)strtoul(ms, NULL, 10) : 0;
	return tensord_main(argc, argv);
}
