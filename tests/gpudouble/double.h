/*
 * The GPU driver double: what libcuda.so.1, libnvidia-ml.so.1 and
 * libamdhip64.so.6 built from tests/gpudouble/ share. It stands in for the
 * real driver in whole-system runs on machines without a GPU (CI): the
 * daemon and the clients dlopen the driver by soname, so LD_LIBRARY_PATH
 * selects the double. Unlike the recording fakes of the unit tests
 * (tests/unit/fake_gpu.h), it moves real memory between processes:
 *
 * - device memory is a memfd per allocation; a device pointer is the
 *   address where this process maps it (so pointers differ per process, as
 *   on hardware);
 * - VMM export is a descriptor of that memfd, import reads its name; a
 *   second import of an allocation this process holds returns the same
 *   handle, and a cuMemRelease of it ends it for both imports (the
 *   driver's documentation promises neither the same handle nor a new one:
 *   the strictest reading, which a client that imports twice fails on);
 *   legacy IPC handles name the exporter's pid and descriptor, opened
 *   through /proc/PID/fd (so they fail across pid namespaces, as on
 *   hardware);
 * - each mapping has an access right per device; a copy into a read-only
 *   mapping is refused (CUDA_ERROR_INVALID_VALUE, as an H100 answers), and
 *   a "kernel" (memset, an asynchronous copy) that touches memory without
 *   the right faults and poisons the process: every later call answers
 *   the sticky error, as a lost CUDA context does;
 * - asynchronous work is queued and runs only when someone synchronizes,
 *   so an unmap with work pending is caught (it is reported, and the work
 *   then faults);
 * - memory is counted across processes in a shared file (dead processes'
 *   share is dropped, as the driver does at exit), which cuMemGetInfo and
 *   NVML read;
 * - a process that made driver calls and then forked gets errors in the
 *   child, and the call is reported.
 *
 * Reports (one line each, also on stderr) go to $TD_GPU_DOUBLE_DIR/report:
 * "violation" lines (an unmap with work pending, a legacy allocation freed
 * while another live process has it open, a call after fork, a fault) and,
 * where TD_GPU_DOUBLE_LEAKS names the program ("tensord"; "1": every
 * process), "leak" lines for what it still holds at exit (allocations,
 * mappings, reservations, context references, queued work; a client that
 * exits without closing is not wrong to, the driver cleans up after it, so
 * tests ask this of the daemon). Tests read that file.
 *
 * Environment: TD_GPU_DOUBLE_DIR (state and report; default
 * /tmp/tensord-gpu-double-UID), TD_GPU_DOUBLE_DEVICES (2), TD_GPU_DOUBLE_MEM
 * (bytes per device, 8 GiB), TD_GPU_DOUBLE_CTX_BYTES (a context's own
 * memory, 64 MiB), TD_GPU_DOUBLE_NO_VMM=1 (CUDA: no VMM attributes),
 * TD_GPU_DOUBLE_NO_PROT_READ=1 (cuMemSetAccess refuses PROT_READ),
 * TD_GPU_DOUBLE_NO_PEER=1 (devices cannot reach each other),
 * TD_GPU_DOUBLE_LEAKS, CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES.
 */
#ifndef TENSORD_GPU_DOUBLE_H
#define TENSORD_GPU_DOUBLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DBL_MAX_DEV 8

/* What a call into the double can come to; each front end names them its way. */
enum dbl_err {
	DBL_OK = 0,
	DBL_INVALID_VALUE,
	DBL_OUT_OF_MEMORY,
	DBL_NOT_INITIALIZED, /* no init yet, or a child after fork */
	DBL_NO_DEVICE,
	DBL_INVALID_DEVICE,
	DBL_INVALID_CONTEXT,
	DBL_MAP_FAILED,
	DBL_ALREADY_MAPPED,
	DBL_INVALID_HANDLE,
	DBL_NOT_SUPPORTED,
	DBL_ILLEGAL_ADDRESS, /* sticky: the process's device state is lost */
	DBL_PEER_ACCESS_UNSUPPORTED,
};

/* How a mapping came to be, for reports and for what may be done to it. */
enum dbl_map_kind {
	DBL_MAP_OWN,      /* cuMemAlloc / hipMalloc: the allocation's own mapping */
	DBL_MAP_IPC,      /* opened from a legacy IPC handle */
	DBL_MAP_VMM,      /* cuMemMap into a reservation */
	DBL_MAP_RESERVED, /* a reservation with nothing mapped there */
};

enum dbl_access { DBL_NONE = 0, DBL_READ = 1, DBL_RW = 3 };

struct dbl_alloc {
	uint64_t id; /* unique across processes: pid << 32 | a counter */
	int fd;      /* the memfd, named "tdgpu-<id>-<dev>" */
	size_t size;
	int dev;       /* physical device */
	int refs;      /* handles and mappings of this process that use it */
	bool released; /* the creator's or importer's handle was given back */
	struct dbl_alloc *next;
};

struct dbl_map {
	uintptr_t addr;
	size_t size;
	enum dbl_map_kind kind;
	struct dbl_alloc *alloc; /* NULL for a bare reservation */
	uint8_t access[DBL_MAX_DEV];
	int refs; /* IPC opens of the same allocation */
	struct dbl_map *next;
};

/* A legacy IPC handle as the double lays out the 64 opaque bytes. */
struct dbl_ipc_handle {
	char magic[8]; /* "tdgpuipc" */
	uint32_t pid;
	int32_t fd;
	uint64_t id;
	uint64_t size;
	int32_t dev;
	char pad[28];
};
_Static_assert(sizeof(struct dbl_ipc_handle) == 64, "IPC handle");

/* One lock over all of the double's state in this process. */
void dbl_lock(void);
void dbl_unlock(void);

/*
 * Reads the environment once (the vendor's *_VISIBLE_DEVICES names the
 * variable): DBL_OK, DBL_NO_DEVICE where nothing is visible, or
 * DBL_NOT_INITIALIZED in a child forked after driver calls.
 */
enum dbl_err dbl_init(const char *visible_var);
/* DBL_OK, or why a call must fail now (not initialized, forked, poisoned). */
enum dbl_err dbl_check(const char *fn);

int dbl_device_count(void);
int dbl_physical(int ordinal); /* -1 when not visible */
int dbl_ordinal(int physical); /* -1 when not visible */
void dbl_uuid(int physical, uint8_t out[16]);
void dbl_uuid_string(int physical, char out[41]); /* "GPU-xxxxxxxx-xxxx-..." */
int dbl_physical_count(void);                     /* every device, visible or not (NVML sees all) */
uint64_t dbl_total_bytes(void);
uint64_t dbl_used_bytes(int physical); /* every live process's, context included */
/* Bytes pid holds on the device (its contexts and what it created); false when none. */
bool dbl_pid_bytes(int physical, uint32_t pid, uint64_t *bytes);
/* The live processes with a context on the device, up to max; their count. */
int dbl_pids_on(int physical, uint32_t *pids, int max);
bool dbl_vmm(void);
bool dbl_prot_read(void);
bool dbl_peer(int a, int b);

/* Contexts: counted in the shared file while this process holds one. */
void dbl_ctx_charge(int physical, bool on);

/* Allocations (caller holds dbl_lock). */
enum dbl_err dbl_alloc_new(int physical, size_t size, struct dbl_alloc **ret);
enum dbl_err dbl_alloc_import(int fd, struct dbl_alloc **ret);
void dbl_alloc_unref(struct dbl_alloc *a);
bool dbl_alloc_live(const struct dbl_alloc *a); /* one of this process's */

/* Mappings (caller holds dbl_lock). */
enum dbl_err dbl_map_own(struct dbl_alloc *a, int physical, struct dbl_map **ret);
struct dbl_map *dbl_map_at(uintptr_t addr);             /* the mapping that starts at addr */
struct dbl_map *dbl_map_find(uintptr_t addr, size_t n); /* the one containing the range */
enum dbl_err dbl_reserve(size_t size, size_t align, uintptr_t *ret);
enum dbl_err dbl_map_vmm(uintptr_t addr, size_t size, size_t offset, struct dbl_alloc *a);
enum dbl_err dbl_unmap_vmm(uintptr_t addr, size_t size);
enum dbl_err dbl_reserve_free(uintptr_t addr, size_t size);
enum dbl_err dbl_set_access(uintptr_t addr, size_t size, int physical, enum dbl_access acc);
enum dbl_err dbl_free_own(uintptr_t addr, const char *fn);
enum dbl_err dbl_ipc_get(uintptr_t addr, struct dbl_ipc_handle *h);
enum dbl_err dbl_ipc_open(const struct dbl_ipc_handle *h, uintptr_t *ret);
enum dbl_err dbl_ipc_close(uintptr_t addr, const char *fn);

/*
 * Device work on device dev (physical). Synchronous calls run queued work
 * first (legacy default stream semantics). A kernel's fault poisons.
 */
enum dbl_op { DBL_COPY, DBL_SET };
enum dbl_err dbl_copy(int dev, void *dst, const void *src, size_t n, bool is_kernel);
enum dbl_err dbl_set(int dev, void *dst, int value, size_t n);
enum dbl_err dbl_refuse_read_only(int dev, const void *p, size_t n);
enum dbl_err dbl_enqueue(int dev, uintptr_t stream, enum dbl_op op, void *dst, const void *src,
			 int value, size_t n);
enum dbl_err dbl_sync(uintptr_t stream, bool all);

/* A report line ("violation ..." or "leak ...") to stderr and the report file. */
void dbl_report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Whether this process holds something at exit that the report lists; for leak checks. */
void dbl_leak_report(const char *vendor);

#endif /* TENSORD_GPU_DOUBLE_H */
