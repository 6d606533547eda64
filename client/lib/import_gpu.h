/*
 * What the GPU importers share (import_gpu.c). A vendor's importers
 * (gpu/<id>/import_<id>.c) describe their driver in a struct
 * td_gpu_client; this does what is the same for every vendor:
 *  - loading the driver on the first GPU import (once per process; refused
 *    in a child forked after the parent loaded it: the driver does not
 *    survive fork());
 *  - this process's device for the daemon's, by UUID (each process numbers
 *    GPUs its own way), and the UUID of one of its own;
 *  - the legacy IPC import: the handle checked, opened on that device;
 *  - unmapping, which first waits for the work queued on the device:
 *    torch and cupy call the DLPack deleter as soon as an array object
 *    dies, with kernels that read it possibly still queued;
 *  - the creator's sync at publish and put()'s device-to-device copy on
 *    the stream the vendor's row names (common/vendor.h).
 * Every driver call runs with the device made current on the calling
 * thread and the thread's previous state restored afterwards, so the
 * application's choice of device or context is left alone.
 */
#ifndef TENSORD_CLIENT_IMPORT_GPU_H
#define TENSORD_CLIENT_IMPORT_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "gpu/gpu_util.h"
#include "import.h"

struct td_gpu_client;
struct td_gpu_shared;

/* A GPU importer's m->priv; a vendor's own mapping state starts with it. */
struct td_gpu_map {
	const struct td_gpu_client *gc;
	const void *api; /* the vendor's driver table */
	int ordinal;     /* this process's number of the device */
	uint64_t ptr;    /* where the memory starts in this process (a device address) */
	/* The process's import of the memory, which this mapping holds a reference on. */
	struct td_gpu_shared *shared;
};

/*
 * Imports shared in the process. A process may hold several mappings of
 * one allocation: the creator's and its own attach, leases of the same
 * tensor over several connections. Each is imported once per process and
 * the import is shared, refcounted, by every mapping of it (issue 30):
 *  - a CUDA VMM handle, keyed by the daemon's instance and the tensor id
 *    (the exported descriptors of one allocation cannot be told apart on
 *    hardware: each is a file of the driver's control device); every
 *    mapping reserves and maps a range of its own from the one handle, so
 *    each keeps its own access (read-only or read-write), and the handle
 *    is released with the last of them. Importing a second time is not
 *    safe: the driver does not promise a second handle (its documentation:
 *    "no guarantee that the contents of handle will be the same CUDA
 *    memory handle for the same given OS shareable handle"), and where it
 *    hands back the same one, the first mapping's release of it ended the
 *    second's (CUDA_ERROR_INVALID_HANDLE at cuMemMap, as the double
 *    answers);
 *  - a legacy IPC opening, keyed by the handle's bytes: opened once,
 *    closed with its last mapping, rather than leaning on the driver's own
 *    count of repeated opens (which HIP does not promise).
 * A set in one allocation (docs/recycle.md, section 5) is one such
 * import, keyed by the set's share id instead of a tensor id: a reader of
 * 300 members imports once, and every member is a pointer into it.
 * value: the vendor's handle or the opened address.
 */
struct td_gpu_shared {
	const struct td_gpu_client *gc;
	int ordinal;
	uint8_t key[64];
	size_t key_len; /* 0: never shared (no key known) */
	uint64_t value;
	unsigned refs; /* mappings holding it; under the table's lock */
	/*
	 * A GPU ring buffer's import (TD_GPU_RING_SHARE, docs/recycle.md
	 * section 4): when its last mapping goes it stays imported, its views
	 * mapped, parked (parked_ns: since when, CLOCK_MONOTONIC; 0 in use),
	 * so that a later version in the same allocation makes no driver call;
	 * td_gpu_parked_sweep() undoes it TD_GPU_PARK_NS after its last use.
	 */
	bool keep;
	uint64_t parked_ns;
	/* The vendor's own state of the import (CUDA: the ranges a set's
	 * mappings share), under the table's lock; owned, freed with the
	 * entry after the last undo. NULL: none. */
	void *vendor;
	LIST_ENTRY(td_gpu_shared) link;
};

/*
 * How long a GPU ring buffer's import stays parked after its last mapping:
 * TD_GPU_PARK_NS, or TENSORD_GPU_PARK_MS (at most an hour) from the
 * environment. Parked, it keeps the allocation's memory alive after the
 * daemon freed it (the driver counts the import), so it is short.
 */
#define TD_GPU_PARK_NS 1000000000ull
uint64_t td_gpu_park_ns(void);

/* The table's lock: held across a lookup and the import it may lead to. */
void td_gpu_shared_lock(void);
void td_gpu_shared_unlock(void);

/* Lock held. The import of key (key_len bytes, at most 64) on gc's ordinal, with a reference taken; NULL: none. */
struct td_gpu_shared *td_gpu_shared_find(const struct td_gpu_client *gc, int ordinal,
					 const void *key, size_t key_len);

/*
 * Lock held. Adds the import value of key (key_len 0: one no other
 * mapping finds) with one reference. NULL when out of memory (error set):
 * the caller undoes the import.
 */
struct td_gpu_shared *td_gpu_shared_add(const struct td_gpu_client *gc, int ordinal,
					const void *key, size_t key_len, uint64_t value);

/*
 * Lock held. Drops a reference taken by find() or add(); true when it was
 * the last (s is off the table then, the caller's to undo and free). The
 * last of a kept import parks it instead (false): a find() takes it back.
 */
bool td_gpu_shared_put(struct td_gpu_shared *s);

/*
 * Whether the calling thread dropped the last reference on an import
 * (td_gpu_shared_put(): parked it, or let it go) since its last
 * td_gpu_last_watch(): a lease's end asks, so that only the last mapping
 * of a GPU ring buffer in this process waits for the device before its
 * Release (release.c, td_release_needs_sync()).
 */
void td_gpu_last_watch(void);
bool td_gpu_last_dropped(void);

/*
 * Undoes the parked imports whose last use is TD_GPU_PARK_NS before now
 * (all of them when now is UINT64_MAX), each by its vendor's unpark();
 * in a forked child only forgets them. Returns when the next one falls
 * due (CLOCK_MONOTONIC ns), 0 when none is parked. Any thread, no lock.
 */
uint64_t td_gpu_parked_sweep(uint64_t now);

/*
 * Waits for every stream of this process's device (type, ordinal): what
 * a release of recycled GPU memory waits for before it is sent (the
 * flusher's, release.c). 0 or -errno; nothing is reported.
 */
int td_gpu_device_sync(int device_type, int ordinal);

/*
 * Drops p's reference on its import, if any; the last one calls
 * undo(p, value) under the table's lock (the device made current by the
 * caller) and frees the entry. p->shared is NULL after.
 */
void td_gpu_shared_drop(struct td_gpu_map *p, void (*undo)(struct td_gpu_map *p, uint64_t value));

/* What enter() changed on the calling thread, for leave() to restore. */
struct td_gpu_scope {
	int prev_device; /* the thread's device before (HIP); -1: none to restore */
};

/*
 * A vendor's driver as the shared code needs it. Driver results are ints
 * (CUresult, hipError_t), 0 for success; the rest returns 0 or -errno.
 */
struct td_gpu_client {
	int device_type;         /* TD_GPU_TYPE_<id>: its row in common/vendor.h */
	const char *visible_env; /* what renumbers its devices: "CUDA_VISIBLE_DEVICES" */
	const char *loaded;      /* what fork() breaks: "initialised CUDA" */
	/* Devices without a UUID (on either side) are matched by ordinal (HIP). */
	bool ordinal_fallback;
	size_t map_size;       /* of its mapping state, which starts with struct td_gpu_map */
	size_t ipc_handle_len; /* of a legacy IPC handle; 0 without legacy IPC */

	/* Its shim's td_<id>_api_get() and td_<id>_api_in_use(). */
	int (*get)(const void **ret_api, const char **ret_why);
	bool (*in_use)(void);
	/* A driver result as -errno, and as text ("CUDA_ERROR_X (...)"); api may be NULL. */
	int (*errno_of)(int r);
	const char *(*strerror)(const void *api, int r, char *buf, size_t len);

	/*
	 * Fills uuids[i] for each of this process's devices, at most
	 * TD_GPU_MAX_DEVICES, their number in *ret_n; *ret_have false when the
	 * driver reports no UUIDs. 0 or -errno (error set).
	 */
	int (*uuids)(const void *api, uint8_t (*uuids)[TD_GPU_UUID_LEN], int *ret_n,
		     bool *ret_have);
	/*
	 * Says that the daemon's device daemon_id, of UUID uuid (as text), is
	 * none of this process's n: sets the error, returns -ENODEV.
	 */
	int (*not_seen)(int daemon_id, const char *uuid, int n);

	/*
	 * Makes p's device current on this thread (CUDA: pushes its primary
	 * context, retained), saving in s what leave() restores. 0, or -errno
	 * with nothing left to restore; the error is set only when what (the
	 * caller's operation) is not NULL.
	 */
	int (*enter)(struct td_gpu_map *p, struct td_gpu_scope *s, const char *what);
	void (*leave)(struct td_gpu_map *p, struct td_gpu_scope *s);
	/* Between enter() and leave(): waits for every stream of the device. */
	int (*synchronize)(struct td_gpu_map *p);
	/*
	 * Between enter() and leave(): copies n bytes device to device on
	 * stream, DLPack's number for the vendor's streams, and waits for it.
	 */
	int (*copy)(struct td_gpu_map *p, void *dst, const void *src, size_t n, long stream);
	/*
	 * Opens the legacy IPC handle (ipc_handle_len bytes) on p's device into
	 * p->ptr: at least map_size bytes; with opened, p->ptr is where this
	 * process opened it already (p->shared): only what a mapping holds of
	 * the device is taken. 0 or -errno (error set). NULL without legacy
	 * IPC.
	 */
	int (*ipc_open)(struct td_gpu_map *p, const uint8_t *handle, uint64_t map_size,
			bool opened);
	/*
	 * Between enter() and leave(), the device idle: gives the memory at
	 * p->ptr back, and p's reference on its import (td_gpu_shared_drop()),
	 * which the last one undoes.
	 */
	void (*release)(struct td_gpu_map *p);
	/* After release(): lets go of what the mapping held of the device. NULL: nothing. */
	void (*drop)(struct td_gpu_map *p);
	/*
	 * Whether p's release() waits for the device itself before it unmaps
	 * anything, so td_gpu_unmap() need not: a mapping that shares its range
	 * with others (a set's members) unmaps nothing until the last of them
	 * goes, and a member released while kernels run on the device must not
	 * wait for them. NULL: never.
	 */
	bool (*waits_in_release)(const struct td_gpu_map *p);
	/*
	 * A parked import (td_gpu_shared.keep) off the table: waits for the
	 * device, unmaps what it kept mapped, releases the import and what
	 * it held of the device. NULL: the vendor keeps none.
	 */
	void (*unpark)(struct td_gpu_shared *s);
	/* Waits for every stream of this process's device ordinal (api loaded). 0 or -errno. */
	int (*sync_ordinal)(const void *api, int ordinal);
};

/* Each vendor's, td_<id>_client (gpu/<id>/import_<id>.c). */
#define TD_GPU_CLIENT_DECLARE(id, ...) extern const struct td_gpu_client td_##id##_client;
TD_GPU_VENDORS(TD_GPU_CLIENT_DECLARE)
#undef TD_GPU_CLIENT_DECLARE

/* Loads gc's driver into *ret_api, or says why not in the thread's error (-ENODEV). */
int td_gpu_load(const struct td_gpu_client *gc, const void **ret_api);

/*
 * This process's ordinal of the daemon's device daemon_id with uuid
 * (uuid_len 16). 0 or -ENODEV (error set).
 */
int td_gpu_ordinal_of_uuid(const struct td_gpu_client *gc, const uint8_t *uuid, size_t uuid_len,
			   int daemon_id, int *ret_ordinal);

/* Sets the error "what: <gc's words for driver result r>"; returns r as -errno. */
int td_gpu_fail(const struct td_gpu_client *gc, const void *api, int r, const char *what);

/* A zeroed mapping state of gc->map_size bytes for ordinal, or NULL. */
struct td_gpu_map *td_gpu_map_new(const struct td_gpu_client *gc, const void *api, int ordinal);

/* Fills m from the opened p (base p->ptr, the tensor at d's offset); m owns p from here. */
void td_gpu_mapped(struct td_mapping *m, struct td_gpu_map *p, const struct td_import_desc *d);

/* importer.map for legacy IPC handles of gc's devices. Takes ownership of fd (there should be none). */
int td_gpu_map_ipc(const struct td_gpu_client *gc, struct td_mapping *m, int fd,
		   const struct td_import_desc *d);

/* importer.unmap, .sync and .copy_in of every GPU importer. */
void td_gpu_unmap(struct td_mapping *m);

/*
 * An importer's clean() for memory every lease of this process shares
 * (one import per allocation): always true, so a bound attach (bindings.c)
 * is served from the mapping with no round trip. A write through it shows
 * in every lease here, as it does without bindings; readers' VMM access
 * is read-only.
 */
bool td_gpu_shared_clean(const struct td_mapping *m);
int td_gpu_sync(struct td_mapping *m);
int td_gpu_copy_in(struct td_mapping *m, const void *src, uint64_t n);

#endif /* TENSORD_CLIENT_IMPORT_GPU_H */
