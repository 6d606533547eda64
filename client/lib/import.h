/*
 * Importers turn what the daemon hands over for a lease (a descriptor or IPC
 * handle bytes) into memory this process can address. One per handle kind;
 * the client library picks the importer by Lease.handle and caches the
 * resulting mapping by tensor id while any lease in this process uses it.
 */
#ifndef TENSORD_CLIENT_IMPORT_H
#define TENSORD_CLIENT_IMPORT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include <tensord/tensord.h>

#include "common/vendor.h"
#include "proto/tensord.pb-c.h" /* Tensord__HandleKind */

/*
 * The share ids of GPU ring buffers (the daemon's REG_RING_SHARE |
 * REG_GPU_RING_SHARE, docs/recycle.md section 4): CUDA VMM allocations
 * later versions of their writer reuse.
 */
#define TD_GPU_RING_SHARE (1ull << 61)

/* What the daemon said about the memory of one lease. Borrowed for the call. */
struct td_import_desc {
	Tensord__HandleKind handle_kind;
	uint64_t map_size;   /* bytes of the whole allocation */
	bool writable;       /* map it shared and writable */
	bool populate;       /* about to be filled: map every page now */
	bool shared;         /* the memory holds other tensors too (a slab): map only
				     [ipc_offset, ipc_offset + map_size), and keep no fd */
	DLDevice device;     /* as the daemon numbers it */
	const uint8_t *uuid; /* GPU UUID, uuid_len 16; NULL for cpu */
	size_t uuid_len;
	const uint8_t *ipc_handle;
	size_t ipc_handle_len;
	uint64_t ipc_offset;
	/*
	 * Host memory this process mapped already, shared and writable, from
	 * the same descriptor (the client's reserve, premapped_len bytes at
	 * premapped, MADV_DONTFORK): map() takes it over instead of mapping
	 * anew. NULL: none.
	 */
	void *premapped;
	uint64_t premapped_len;
	/*
	 * premapped is a buffer of the client's ring (docs/recycle.md), lent
	 * for this mapping: map() uses it as it is (MADV_DONTFORK kept, no
	 * descriptor needed), and unmap() leaves it mapped.
	 */
	bool premapped_lent;
	/*
	 * The allocation's name across this process's connections: the
	 * daemon's HelloReply.instance and the tensor's id. A GPU importer
	 * imports an allocation once per process whatever the number of
	 * leases (import_gpu.h, "Imports shared in the process"); instance 0:
	 * not known, imported for this mapping alone.
	 */
	uint64_t daemon_instance;
	uint64_t tensor_id;
	/*
	 * Nonzero: the memory holds other tensors too under this id
	 * (Lease.share_id). A GPU importer then keys its one import by it
	 * rather than by tensor_id (a set in one allocation: one import per
	 * set, every member at its ipc_offset), and its read-only mappings
	 * share one range of it.
	 */
	uint64_t share_id;
	const char *name; /* the tensor's, for errors; may be NULL */
	/*
	 * The slab (shared) mapped whole in this client, or NULL: map() of a
	 * read-only lease points into it, with a reference of its own, when
	 * every page under the tensor is clean there (td_pages_clean()), and
	 * maps a window of its own otherwise. Borrowed for the call.
	 */
	struct td_slabmap *slab;
};

/*
 * A slab (shared memory of small tensors) mapped whole, once per client:
 * MAP_PRIVATE, read-write (a stray write stays in this process), faulted
 * lazily. Kept by the cache's share entry (mapcache.h) and by every
 * mapping that points into it, so never unmapped under a lease.
 */
struct td_slabmap {
	atomic_uint refs;
	void *base;
	uint64_t size;
	/*
	 * Per page of the slab, the mappings (struct td_mapping, each used by
	 * one lease or more) that point into it. A page a stray write copied
	 * privately is dropped (MADV_DONTNEED, so that it shows the slab
	 * again) only while this is 0. Guarded by lock, borrowed from the
	 * client (its cache's lock, which fork() holds across the fork).
	 */
	uint32_t *uses;
	pthread_mutex_t *lock;
};

/* One mapped allocation in this process. */
struct td_mapping {
	uint64_t id; /* the tensor's id: the cache key */
	Tensord__HandleKind handle_kind;
	void *base;        /* start of the allocation here (device pointer for GPUs) */
	void *data;        /* base + ipc_offset: where the tensor starts */
	uint64_t size;     /* bytes mapped at base */
	uint64_t file_off; /* where base is in the file (host memory) */
	bool writable;
	/*
	 * A write through this mapping is refused by the OS or the driver (a
	 * CUDA VMM mapping granted PROT_READ). False for writable mappings, for
	 * legacy IPC and HIP (no read-only mappings), for host memory (a private
	 * copy-on-write mapping: a stray write stays in this process) and where
	 * the driver refused PROT_READ and the importer fell back to read-write.
	 */
	bool ro_enforced;
	/* base was lent by its owner (td_import_desc.premapped_lent): unmap() leaves it. */
	bool lent;
	/*
	 * CUDA VMM: how many of this process's other devices were given the
	 * same access as the one that owns the memory (those the driver says
	 * can reach it), so that a peer copy (torch's .to("cuda:1")) may read
	 * it; 0 for other memory. peers_refused: the driver refused access for
	 * them, so only the owner has it.
	 */
	unsigned peers;
	bool peers_refused;
	DLDevice device; /* as this process numbers it */
	unsigned refs;   /* leases using it; guarded by the client's lock */
	void *priv;      /* the importer's own state */
	/* Set by the client library, not by importers: */
	char name[TENSORD_NAME_MAX + 1]; /* the tensor's name when mapped */
	bool created_here;               /* this process created it (it may publish) */
	bool filling;     /* its create took the client's reserve; its publish ends the filling */
	uint32_t flags;   /* the tensor's TENSORD_MUTABLE | ... */
	bool reusable;    /* a repeat attach of name may reuse it */
	bool in_slab;     /* in shared memory (a slab): a window, or a place in its whole mapping */
	uint64_t ring_id; /* nonzero: base is that ring buffer's mapping, lent (ring.c) */
	bool revoked;     /* unmapped by tensord_close(): the last unref only frees */
	/* A GPU ring buffer's (TD_GPU_RING_SHARE): its leases end after a device sync. */
	bool gpu_ring;
	/* A tensor in a slab that points into the slab's whole mapping (one
	 * reference on it) instead of a window of its own; NULL otherwise. */
	struct td_slabmap *slab;
	LIST_ENTRY(td_mapping) link;      /* the cache's list, or one of those going */
	LIST_ENTRY(td_mapping) name_link; /* the cache's index by name, while on its list */
	uint64_t name_hash;               /* of name, for that index: beside its link */
	/* Kept after its last lease (mapcache.h): when, and its place in the parked list. */
	uint64_t parked_ns; /* 0: some lease uses it */
	TAILQ_ENTRY(td_mapping) park_link;
};

struct td_importer {
	Tensord__HandleKind handle_kind;
	/*
	 * The daemon is the exporter (legacy CUDA IPC, HIP IPC): its free while
	 * this process still has the memory open is undefined behaviour, so
	 * tensord_close() unmaps such mappings before the connection ends.
	 */
	bool unmap_before_close;
	/*
	 * Maps what d describes into m (base, data, size, device, priv).
	 * Takes ownership of fd (-1 when none): it is closed on every path.
	 * 0 or -errno; on failure td_set_error() has said why.
	 */
	int (*map)(struct td_mapping *m, int fd, const struct td_import_desc *d);
	/* Undoes map(). Never fails; may run on any thread. */
	void (*unmap)(struct td_mapping *m);
	/*
	 * Called once at publish by the creator of an immutable tensor, before
	 * the daemon freezes it: m must stop being a writable shared mapping
	 * while its address stays valid. NULL when nothing needs doing.
	 */
	int (*make_private)(struct td_mapping *m);
	/*
	 * Undoes make_private() when the publish it prepared failed, so the
	 * creator's view is shared again. NULL when make_private is NULL.
	 */
	int (*make_shared)(struct td_mapping *m);
	/*
	 * Called at publish by the creator, before anything else: waits until
	 * every write this process queued to m's device is complete, so that
	 * readers never see a half-written tensor. NULL for host memory.
	 */
	int (*sync)(struct td_mapping *m);
	/*
	 * A new view of m for one more lease of the same tensor, so that a
	 * consumer that writes through one lease anyway (a copy-on-write
	 * private mapping) never changes what another lease, or a later
	 * attach, sees. *ret_base is the view's start; the tensor starts at
	 * the same offset in it as m->data in m->base. 0 or -errno with the
	 * error set. NULL when leases share m as it is (shared writable
	 * mappings, GPU memory).
	 */
	int (*view)(struct td_mapping *m, void **ret_base);
	/*
	 * Whether every byte of m still shows the shared memory: no stray
	 * write made a private copy of any of its pages. A further lease may
	 * then use m itself instead of a view (so a process holding many
	 * leases of one tensor holds one mapping). False when not known or
	 * too costly to find out. NULL: never.
	 */
	bool (*clean)(const struct td_mapping *m);
	/* Undoes view(). Never fails; may run on any thread. */
	void (*unview)(struct td_mapping *m, void *base);
	/*
	 * m's last lease ended and the cache keeps m only for view(): detaches
	 * the mapping at m->base, which the caller then gives to unview(), and
	 * leaves m->data - m->base as it was. Runs under the cache's lock, so
	 * it only moves pointers. NULL: m cannot be kept without leases.
	 */
	void *(*park)(struct td_mapping *m);
	/*
	 * put() from device memory: copies n bytes from src (an address valid
	 * in this process on the same kind of device, e.g. a torch CUDA
	 * tensor) to m->data on the stream td_gpu_put_stream() names for the
	 * device type, and waits for that stream. NULL: host memory only.
	 */
	int (*copy_in)(struct td_mapping *m, const void *src, uint64_t n);
};

/*
 * Device numbering. The daemon names GPUs by UUID; processes number them
 * each their own way (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES).
 *
 * td_gpu_local_device: the device this process sees as the daemon's
 * daemon_dev (a GPU vendor's, common/vendor.h) with uuid (uuid_len 16; HIP
 * devices may have none, then the ordinal is kept); other devices stay as
 * they are. 0 or -ENODEV (error set).
 *
 * td_gpu_device_uuid: the UUID of this process's device local. 0,
 * -ENOENT when it has none the daemon could match (not a GPU; HIP without
 * UUIDs: the ordinal is all there is), or -ENODEV (error set).
 *
 * Both, and the GPU importers, are in import_gpu.c.
 */
int td_gpu_local_device(DLDevice daemon_dev, const uint8_t *uuid, size_t uuid_len,
			DLDevice *ret_local);
int td_gpu_device_uuid(DLDevice local, uint8_t uuid[16]);

/* Whether this process loaded any GPU vendor's driver: a child forked from it must not call one. */
bool td_gpu_in_use(void);

/*
 * In a child forked after this library initialised a GPU driver (CUDA or
 * HIP) in its parent: the parent's pid, else 0. Then no GPU driver call may
 * be made here: inherited GPU mappings are forgotten, new ones refused.
 * Set by fork.c's fork handler, read without a lock (written before
 * any other thread of the child exists).
 */
extern int td_gpu_forked_from;

/* The importer for a handle kind, or NULL when this library has none. */
const struct td_importer *td_importer_for(Tensord__HandleKind kind);

/* NULL-terminated; looked up by handle_kind. */
extern const struct td_importer *const td_importers[];

extern const struct td_importer td_importer_memfd;

/* The GPU vendors' importers, as common/vendor.h names them (td_importer_cuda, ...). */
#define TD_IMPORTER_DECLARE(id, kind, fd, importer) extern const struct td_importer importer;
TD_GPU_HANDLES(TD_IMPORTER_DECLARE)
#undef TD_IMPORTER_DECLARE

/*
 * The mappings this library makes for leases, against vm.max_map_count
 * (import.c). td_maps_admit() counts one more before an mmap(), or refuses
 * it: -EMFILE with the error set, naming the limit and the counts, when the
 * process would come within a margin of vm.max_map_count (or of a smaller
 * TENSORD_MAX_MAP_COUNT). td_maps_gone() uncounts n (an unmap, or an mmap
 * that failed after its admit); td_maps_adopted() counts a mapping made
 * elsewhere (a reserve's) that a lease now owns. td_maps_held_now(): ours.
 */
int td_maps_admit(const char *name);
void td_maps_gone(long n);
void td_maps_adopted(void);
long td_maps_held_now(void);

/*
 * Slabs mapped whole (import.c). td_slabmap_new(): maps the slab behind
 * fd (borrowed) whole, counted by td_maps_admit(), with one reference;
 * lock (borrowed, the client's) guards its page uses. NULL (error set)
 * when it cannot, or when /proc/self/pagemap cannot be read (then tensors
 * keep windows of their own). td_slabmap_ref() / td_slabmap_unref(): the
 * last reference unmaps it. td_pages_clean(): whether every page of
 * [p, p + len) in a private file mapping still maps the file (no write
 * made a private copy); false when not known.
 */
struct td_slabmap *td_slabmap_new(int fd, const char *name, pthread_mutex_t *lock);
void td_slabmap_ref(struct td_slabmap *s);
void td_slabmap_unref(struct td_slabmap *s);
bool td_pages_clean(const void *p, uint64_t len);

/* Sets the calling thread's tensord_last_error() text; returns err. */
int td_set_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Empties the calling thread's tensord_last_error() text. */
void td_clear_error(void);

#endif /* TENSORD_CLIENT_IMPORT_H */
