/*
 * Where a cold VMM attach spends its time, call by call, on real hardware.
 *
 *   cc -O2 -isystem $CUDA_HOME/include tests/gpu/vmm_cost.c -l:libcuda.so.1 -o vmm_cost
 *   ./vmm_cost [MiB] [rounds]
 *
 * One process plays both sides, as the daemon (create, export a fresh fd
 * per lease) and as a client (import, reserve, map, set access read-only,
 * then unmap and free), and prints the median of each step in
 * microseconds. The daemon-side steps run with the context current, as
 * backend_cuda.c makes it; the client side pushes the primary context as
 * import_cuda.c does. Not part of make test: it needs a GPU (tests/gpu/run.sh
 * builds and runs it after the suite).
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                                      \
	do {                                                                                       \
		CUresult r_ = (x);                                                                 \
		if (r_ != CUDA_SUCCESS) {                                                          \
			const char *s_ = NULL;                                                     \
			cuGetErrorString(r_, &s_);                                                 \
			fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?");  \
			exit(1);                                                                   \
		}                                                                                  \
	} while (0)

enum {
	EXPORT,
	DUP_CACHED,
	IMPORT_CACHED,
	CLOSE_CACHED,
	CTX_RETAIN,
	IMPORT,
	RESERVE,
	MAP,
	ACCESS_RO,
	ACCESS_RW,
	UNMAP,
	ADDR_FREE,
	RELEASE_H,
	CLOSE_FD,
	NSTEPS
};
static const char *step_name[NSTEPS] = {
	"export (daemon)",
	"dup of a kept export",
	"import of the dup",
	"close of the dup",
	"primary ctx retain+push",
	"import fd",
	"address reserve",
	"map",
	"set access read-only",
	"set access read-write",
	"unmap",
	"address free",
	"release handle",
	"close fd",
};

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
	int rounds = argc > 2 ? atoi(argv[2]) : 50;
	double *t[NSTEPS];
	CUmemAllocationProp prop;
	CUmemGenericAllocationHandle h, ih;
	CUmemAccessDesc acc;
	CUcontext ctx, popped;
	CUdevice dev;
	size_t gran, size;
	CUdeviceptr ptr;
	double t0;
	int kept = -1;

	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	size = (mib << 20) + gran - 1;
	size -= size % gran;
	CK(cuMemCreate(&h, size, &prop, 0));
	for (int s = 0; s < NSTEPS; s++)
		t[s] = calloc((size_t)rounds, sizeof(double));
	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = dev;

	CK(cuMemExportToShareableHandle(&kept, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	for (int i = 0; i < rounds; i++) {
		int fd = -1, d = -1;

#define STEP(s, call)                                                                              \
	do {                                                                                       \
		t0 = now_us();                                                                     \
		call;                                                                              \
		t[s][i] = now_us() - t0;                                                           \
	} while (0)
		STEP(EXPORT, CK(cuMemExportToShareableHandle(
				     &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)));
		/* The daemon keeps one export and sends it (SCM_RIGHTS dups the file). */
		STEP(DUP_CACHED, d = dup(kept));
		STEP(IMPORT_CACHED,
		     CK(cuMemImportFromShareableHandle(&ih, (void *)(uintptr_t)d,
						       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)));
		STEP(CLOSE_CACHED, close(d));
		CK(cuMemRelease(ih));
		CK(cuCtxSetCurrent(NULL));
		STEP(CTX_RETAIN, {
			CK(cuDevicePrimaryCtxRetain(&ctx, dev));
			CK(cuCtxPushCurrent(ctx));
		});
		STEP(IMPORT,
		     CK(cuMemImportFromShareableHandle(&ih, (void *)(uintptr_t)fd,
						       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)));
		STEP(CLOSE_FD, close(fd));
		STEP(RESERVE, CK(cuMemAddressReserve(&ptr, size, gran, 0, 0)));
		STEP(MAP, CK(cuMemMap(ptr, size, 0, ih, 0)));
		STEP(RELEASE_H, CK(cuMemRelease(ih)));
		acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
		STEP(ACCESS_RO, CK(cuMemSetAccess(ptr, size, &acc, 1)));
		acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		STEP(ACCESS_RW, CK(cuMemSetAccess(ptr, size, &acc, 1)));
		STEP(UNMAP, CK(cuMemUnmap(ptr, size)));
		STEP(ADDR_FREE, CK(cuMemAddressFree(ptr, size)));
		CK(cuCtxPopCurrent(&popped));
		CK(cuDevicePrimaryCtxRelease(dev));
		CK(cuCtxSetCurrent(ctx));
	}
	printf("vmm_cost: %zu bytes (granularity %zu), %d rounds, median / max us:\n", size, gran,
	       rounds);
	for (int s = 0; s < NSTEPS; s++) {
		qsort(t[s], (size_t)rounds, sizeof(double), cmp);
		printf("  %-26s %9.1f %9.1f\n", step_name[s], t[s][rounds / 2], t[s][rounds - 1]);
	}
	CK(cuMemRelease(h));
	return 0;
}
