/*
 * What each GPU vendor is, said here once. Everything else that needs to
 * know asks the table below (td_gpu_vendor_of() and friends, common/vendor.c)
 * or expands the rows itself, as libuv's UV_ERRNO_MAP feeds its enum, its
 * names and its messages: the device names "cuda:N" both ways, which device
 * types the CPU can read and which are GPUs, the streams of DLPack, which
 * handle kinds carry a descriptor, the daemon's backend table, the client
 * library's importer table and device numbering, Python's device names and
 * stream rule. Outside gpu/<id>/, no code names a vendor but these rows
 * (comments give examples) and the schema's HandleKind values.
 *
 * A row of TD_GPU_VENDORS: X(id, DL, name, device, put_stream, streams,
 * host types...)
 *   id          the vendor's folder, gpu/<id>/, and the names of what it
 *               defines there: its driver shim td_<id>_api_*() in
 *               <id>_api.[ch] (linked into both sides), the daemon's
 *               backend_<id> (a struct backend_ops, "<id>" in stats) in
 *               backend_<id>.c (it and any other file of the folder go
 *               into the daemon), and the client library's td_<id>_client
 *               (what client/lib/import_gpu.h needs of the driver) with its
 *               importers in import_<id>.c (import_*.c go into libtensord)
 *   DL          its DLPack device type is kDL<DL>
 *   name        what messages call it ("CUDA")
 *   device      its devices' name: "<device>:N", in C, tensorctl and Python
 *   put_stream  the stream put() copies a device source on, as DLPack
 *               numbers streams for the device type (tensord_put_stream())
 *   streams     which of the stream numbers 0, 1 and 2 mean a stream of
 *               its own (TD_GPU_STREAM(n)); DLPack forbids the others, and
 *               numbers above 2 are stream handles, valid for every GPU
 *   host types  its other DLPack device types: memory the CPU addresses
 *               (pinned host memory, managed memory)
 *
 * A row of TD_GPU_HANDLES, one per Tensord__HandleKind of GPU memory:
 * X(id, kind, fd, importer): vendor id's memory travels as
 * TENSORD__HANDLE_KIND__<kind>, with a descriptor in the lease's frame
 * when fd is true (else it is a legacy IPC handle, td_gpu_handle_ipc()),
 * and the client library maps it with importer (a struct td_importer of
 * gpu/<id>/import_<id>.c).
 */
#ifndef TENSORD_GPU_VENDOR_H
#define TENSORD_GPU_VENDOR_H

#include <stdbool.h>
#include <stddef.h>

#include <tensord/dlpack.h>

/* In a row's streams: DLPack stream number n (0, 1 or 2) is one of the vendor's. */
#define TD_GPU_STREAM(n) (1u << (n))

/*
 * CUDA: 1 is the legacy default stream, 2 the per-thread default stream,
 * 0 is ambiguous in DLPack and refused. ROCm: 0 is the default (null)
 * stream, 1 and 2 are refused.
 */
#define TD_GPU_VENDORS(X)                                                                          \
	X(cuda, CUDA, "CUDA", "cuda", 1, TD_GPU_STREAM(1) | TD_GPU_STREAM(2), kDLCUDAHost,         \
	  kDLCUDAManaged)                                                                          \
	X(hip, ROCM, "HIP", "rocm", 0, TD_GPU_STREAM(0), kDLROCMHost)

#define TD_GPU_HANDLES(X)                                                                          \
	X(cuda, HANDLE_CUDA_VMM_FD, true, td_importer_cuda)                                        \
	X(cuda, HANDLE_CUDA_IPC, false, td_importer_cuda_ipc)                                      \
	X(hip, HANDLE_HIP_IPC, false, td_importer_hip)

/* A row of TD_GPU_VENDORS as data. */
struct td_gpu_vendor {
	const char *id;             /* "cuda" */
	const char *name;           /* "CUDA" */
	const char *device;         /* "cuda" */
	DLDeviceType device_type;   /* kDLCUDA */
	long put_stream;            /* 1 */
	unsigned streams;           /* TD_GPU_STREAM(1) | TD_GPU_STREAM(2) */
	DLDeviceType host_types[4]; /* kDLCUDAHost, kDLCUDAManaged; ends at the first 0 */
};

/* A row of TD_GPU_HANDLES as data. */
struct td_gpu_handle {
	const char *vendor; /* its vendor's id */
	int kind;           /* Tensord__HandleKind */
	bool fd;            /* a descriptor travels with a lease */
};

/* The rows, in the order of the macros; each array ends with a row of NULL id / vendor. */
extern const struct td_gpu_vendor td_gpu_vendors[];
extern const struct td_gpu_handle td_gpu_handles[];

/*
 * Each vendor's device type by its id, for initializers that a row's
 * fields cannot be (C reads no object in a constant expression):
 * TD_GPU_TYPE_cuda is kDLCUDA. And by its DLPack name, as the tests spell
 * it: TD_GPU_DL_CUDA.
 */
#define TD_GPU_TYPE_ENUM(id, dl, ...) TD_GPU_TYPE_##id = kDL##dl,
#define TD_GPU_DL_ENUM(id, dl, ...) TD_GPU_DL_##dl = kDL##dl,
enum { TD_GPU_VENDORS(TD_GPU_TYPE_ENUM) };
enum { TD_GPU_VENDORS(TD_GPU_DL_ENUM) };
#undef TD_GPU_TYPE_ENUM
#undef TD_GPU_DL_ENUM

/* "No stream": what td_gpu_put_stream() says for devices that take none. */
#define TD_GPU_NO_STREAM (-1L)

/* The vendor whose devices are of device_type (kDLCUDA), or NULL (kDLCPU, kDLCUDAHost). */
const struct td_gpu_vendor *td_gpu_vendor_of(int device_type);

/*
 * The vendor whose device name s starts with ("cuda:1", "rocm"), and in
 * *ret_rest what follows the name; NULL when none.
 */
const struct td_gpu_vendor *td_gpu_vendor_named(const char *s, const char **ret_rest);

/* Whether device_type is a vendor's memory the CPU addresses (kDLCUDAHost, kDLROCMHost). */
bool td_gpu_host_type(int device_type);

/*
 * The stream put() copies on, as DLPack numbers streams for the device
 * type: tensord passes it to the producer's __dlpack__(stream=...), so the
 * producer orders its queued writes before that stream (DLPack's consumer
 * stream), copies on it and waits for it: the row's put_stream.
 * TD_GPU_NO_STREAM for the host and other devices: pass stream=None.
 */
long td_gpu_put_stream(int device_type);

/*
 * Whether a consumer may pass stream to __dlpack__() of memory of
 * device_type, by DLPack's rules: -1 ("do not synchronise") always; for a
 * vendor's devices the stream numbers of its row and any handle above 2.
 */
bool td_gpu_stream_valid(int device_type, long stream);

/* Whether a lease of a GPU handle kind carries a descriptor (false for kinds not in the table). */
bool td_gpu_handle_fd(int kind);

/*
 * Whether kind is a legacy IPC handle (HANDLE_CUDA_IPC, HANDLE_HIP_IPC):
 * the rows without a descriptor, whose bytes name memory inside the
 * exporting process, the daemon. No kernel or driver counts an importer's
 * mapping of it, so the daemon must not free that memory while a client
 * process may still have it open (docs/gpu.md, "Who owns what"). A handle
 * with a descriptor (CUDA VMM) is refcounted by the driver. False for
 * kinds not in the table.
 */
bool td_gpu_handle_ipc(int kind);

#endif /* TENSORD_GPU_VENDOR_H */
