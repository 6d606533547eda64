/*
 * The registry: names -> tensors, their states and lifetimes, the lease
 * ledger of each client, and capacity per device. It knows nothing of
 * sockets or the event loop, so it is unit-tested on its own.
 *
 * Ownership: the registry owns every tensor. A tensor lives while it is
 * named or while any lease on it lives; the last of those to go frees it,
 * through its backend's release().
 */
#ifndef TENSORD_REGISTRY_H
#define TENSORD_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/queue.h> /* LIST_*: the doubly linked lists of tensors */

#include <tensord/tensord.h>
#include <uv/tree.h> /* the BSD red-black tree libuv ships: names in order for List */

#include "daemon/memory/backend.h"
#include "daemon/base/quota.h"

#define REGISTRY_DEVICES_MAX TENSORD_STATS_DEVICES_MAX
/* Leases one client may hold at once; past it, create and attach fail. */
#define REGISTRY_LEASES_MAX (1u << 18)
/* Unlinked names whose last generation is remembered (the oldest goes first). */
#define REGISTRY_TOMBS_MAX (1u << 16)

struct reg_client;
struct reg_tx;

/*
 * Reserves (docs/design.md, "The reserve"): ready host memory a connection
 * keeps mapped for its next creates. At most this many per connection, of
 * at most this many bytes in all, each of REGISTRY_RESERVE_MIN bytes or more.
 */
#define REGISTRY_RESERVES_MAX 4
#define REGISTRY_RESERVE_BYTES_MAX (2ull << 30)
/* The largest set allocation (registry_arena.c): a put_many past it is laid out per member. */
#define REGISTRY_ARENA_BYTES_MAX (64ull << 30)
#define REGISTRY_RESERVE_MIN (1u << 20)

/* How many leases one uid holds on a tensor. */
struct reg_holder {
	uint32_t uid;
	uint32_t n; /* 0: the entry is free */
};

/*
 * One tensor. Its shape, strides and name live in the same allocation,
 * sized to them (a million small tensors cost what they use, not 32
 * dimensions and 255 bytes of name each).
 */
struct tensor {
	uint64_t id; /* unique, never reused */
	char *name;  /* name_len bytes and a NUL, in dims[] */
	size_t name_len;
	DLDataType dtype;
	int32_t ndim;
	int64_t *shape;   /* ndim entries, in dims[] */
	int64_t *strides; /* ndim entries, in elements, in dims[] */
	DLDevice device;
	uint64_t nbytes;
	tensord_state state;
	uint32_t flags; /* TENSORD_MUTABLE | TENSORD_LIFETIME_CONNECTION */
	uint32_t mode;
	uint32_t owner_uid, owner_gid;
	uint64_t created_ns;
	uint32_t refcount;      /* live leases, and 1 while allocating */
	bool fd_charged;        /* counted in its owner's QUOTA_FDS */
	uint64_t bytes_charged; /* counted in its owner's QUOTA_BYTES: its footprint */
	/*
	 * Who holds its leases, by uid (only counted with a quota): h0, then
	 * hv[0 .. n_hv). Once it is unlinked with leases left, its footprint
	 * counts against each holder's QUOTA_PINNED (pinned_bytes), no longer
	 * against its owner's QUOTA_BYTES (docs/security.md, "What a reader
	 * can pin").
	 */
	struct reg_holder h0;
	struct reg_holder *hv; /* owned */
	uint32_t n_hv;
	uint64_t pinned_bytes; /* counted in each holder's QUOTA_PINNED; 0: none */
	bool allocating;       /* the GPU worker is getting its memory */
	uint32_t holds;        /* of refcount, the references of reg_holds (quarantined) */
	bool from_reserve;     /* its memory was the reserve its create named */
	/* Its name went to a later version (or away) while it was leased, and
	 * the state log says so (ENTRY_RETIRED): its end is logged too. */
	bool retired_logged;
	/*
	 * Recycled memory (docs/recycle.md): nonzero, the id of the ring
	 * buffer of ring_rc (the writer's connection, which maps it writable)
	 * that holds t. When t is freed the buffer goes back to ring_rc's free
	 * list instead of being freed, unless ring_rc is gone (NULL) or a
	 * forked child may still read it (ring_tainted).
	 */
	uint64_t ring_id;
	struct reg_client *ring_rc;   /* borrowed; NULL: freed with t */
	LIST_ENTRY(tensor) ring_link; /* ring_rc->ring_tensors, while ring_rc */
	bool ring_hit;                /* its create took a free buffer: no descriptor to send */
	bool ring_tainted;
	/* A GPU create that asked to recycle and found no free buffer: its
	 * memory, once the worker made it, joins its creator's ring. */
	bool gpu_ring;
	/*
	 * A member of a set allocation (registry_arena.c): its memory is
	 * [alloc.ipc_offset, + nbytes) of the arena, whose descriptor
	 * alloc.fd borrows; the arena counts it. NULL: none.
	 */
	struct reg_arena *arena;
	/*
	 * Replace (docs/design.md, "Replace"): a named tensor's pending new
	 * version, and the other way round. A draft is in state CREATED and not
	 * in the name table; its publish gives it the name. Each points at the
	 * other or is NULL; borrowed both ways.
	 */
	struct tensor *draft;
	struct tensor *replaces;
	/* Its generation of the name and the commit that published it; 0 before. */
	uint64_t generation, commit;
	/*
	 * A replica of another node's tensor ("@PEER/NAME", docs/remote.md):
	 * the generation and commit it has on that node, which is what clients
	 * are shown and what after= compares with; 0: not a replica (or a peer
	 * that did not say). generation and commit above stay this node's.
	 */
	uint64_t origin_generation, origin_commit;
	/* The transaction it is a member of (borrowed; NULL: none), and its place there. */
	struct reg_tx *tx;
	TAILQ_ENTRY(tensor) tx_link;
	struct reg_client *creator;      /* borrowed; NULL once the creator is gone */
	struct reg_device *dev;          /* borrowed: the device slot it is charged to */
	struct backend_alloc alloc;      /* owned */
	struct tensor *hnext;            /* hash chain of named tensors */
	RB_ENTRY(tensor) byname;         /* named tensors in name order */
	LIST_ENTRY(tensor) all_link;     /* every live tensor: registry.all */
	LIST_ENTRY(tensor) creator_link; /* what its creator made, while it lives */
	LIST_HEAD(, reg_binding)
	bindings;       /* slots bound to it while it is named (registry_bind.c) */
	int64_t dims[]; /* shape, strides, then the name's bytes */
};

/* One device the daemon can allocate on. */
struct reg_device {
	const struct backend_ops *ops;
	DLDevice device;
	int init_rc;   /* 0, or -errno from ops->init() */
	char why[160]; /* the reason when init_rc < 0 */
	uint64_t capacity;
	uint64_t used;
	uint32_t tensors;
	uint64_t quarantined; /* of used, the footprints of tensors a reg_hold keeps */
};

/*
 * One reserve: a ready memfd of the host backend that only its connection
 * has a descriptor of, charged to that connection's uid (bytes, a
 * descriptor) and to the host's capacity until a create takes it, the
 * connection gives it back, or the connection closes.
 */
struct reg_reserve {
	uint64_t id; /* the connection's name for it: 1, 2, ... */
	struct reg_device *dev;
	struct backend_alloc alloc; /* owned */
	LIST_ENTRY(reg_reserve) link;
	/* A free ring buffer (registry_ring.c): the group and mode of the
	 * versions it held, which the next one must have. */
	uint32_t gid, mode;
	/* The bytes of the versions it held (a GPU allocation is rounded up:
	 * alloc.size is the rounded size), which the next one must have. */
	uint64_t nbytes;
};

/*
 * A set in one allocation (registry_arena.c, docs/recycle.md section 5):
 * one ring buffer of its writer's connection that a transaction's members
 * share, each at its offset. It lives while it has members, or while its
 * transaction may still place some (open); then it goes back to its
 * writer's ring as one free buffer, or is freed. On a GPU (gpu) it is one
 * allocation of the backend (backend_ops.arenas): a free GPU ring buffer
 * of its writer's connection when its put_many asked to recycle and one of
 * its size, group and mode is free, else made on the GPU worker with its
 * first member's create (allocating until then); with its last member it
 * goes back to its writer's ring when it asked to recycle (recycle) and is
 * a CUDA VMM allocation, else it is freed.
 */
struct reg_arena {
	uint64_t id;                /* the ring buffer id of its writer's connection */
	struct reg_client *rc;      /* borrowed; NULL: the writer is gone or let go of it */
	LIST_ENTRY(reg_arena) link; /* rc->arenas, while rc */
	struct reg_device *dev;
	struct backend_alloc alloc; /* owned: its memfd, whole */
	uint32_t gid, mode;         /* of every member, and of whatever it holds next */
	uint64_t fill;              /* members take [offset, offset + nbytes) below this */
	uint32_t members;           /* live tensors in it */
	/*
	 * What members do not take of it (its footprint less their bytes:
	 * room for members to come, padding, slices of members gone), charged
	 * to uid (bytes and one descriptor) and its device like a reserve;
	 * lent: taken out of spare for the member being created.
	 */
	uint32_t uid;
	uint64_t spare, lent;
	bool open;    /* its transaction may place more */
	bool fd_sent; /* its writer was sent its descriptor, or maps it already */
	bool tainted; /* a client leasing a member forked: never recycled */
	bool gpu;     /* device memory (backend_ops.arenas), not a ring buffer */
	/* GPU: the worker is making it (its first member's create), of want
	 * bytes; failed: it could not be made, and takes no member. */
	bool allocating, failed;
	uint64_t want;
	/* GPU: its put_many asked to recycle (Create.recycle of its opening):
	 * it may come from its writer's ring and goes back to it. */
	bool recycle;
};

/* A client's view: who it is and the leases it holds. Embedded in a conn. */
struct reg_client {
	uint64_t id;
	uint32_t uid, gid, pid;
	struct reg_lease *leases; /* slot array; slot i is lease id i+1 (+ generation) */
	uint32_t n_slots, cap_slots;
	uint32_t free_head; /* 1-based index of the first free slot; 0: none */
	uint32_t n_leases;
	uint64_t n_created;          /* tensors it created (create and put), for inspection */
	LIST_HEAD(, tensor) created; /* what it created, for its close to walk */
	LIST_HEAD(, reg_tx) txs;     /* its open transactions (txn.c), owned */
	unsigned n_txs;
	LIST_HEAD(, reg_reserve) reserves; /* owned */
	unsigned n_reserves;
	uint64_t reserved_bytes;
	uint64_t next_reserve; /* the last reserve (or ring buffer) id given out */
	/* Recycled memory (registry_ring.c): the tensors in its ring buffers,
	 * and its free ring buffers (owned, charged like reserves). */
	LIST_HEAD(, tensor) ring_tensors;
	LIST_HEAD(, reg_reserve) ring_free;
	unsigned n_ring_free;
	LIST_HEAD(, reg_arena) arenas; /* set allocations it writes (registry_arena.c) */
	struct reg_page *page;         /* its binding page (registry_bind.c), owned; NULL: none */
};

struct reg_lease {
	struct tensor *t; /* NULL when the slot is free */
	uint32_t gen;
	uint32_t next_free;
	uint64_t since_ns;  /* CLOCK_MONOTONIC when the lease began */
	uint32_t bind_slot; /* its slot of the client's binding page; 0: not bound */
};

/*
 * Leases kept past their connection (docs/gpu.md, "When a connection ends
 * with legacy IPC leases"). With legacy IPC (td_gpu_handle_ipc()) the
 * daemon is the exporter, and no driver counts a client's open handle: a
 * lease on such memory still held when its connection ends may still be
 * open in the client's process. Its tensor keeps its memory, as the lease
 * did (a reference, its uid's holder count), until registry_hold_end(),
 * which the caller runs once that process has exited (quarantine.c).
 * Owned by the registry (registry.holds).
 */
struct reg_hold {
	uint64_t conn_id;
	uint32_t uid, pid;         /* the client's, as its reg_client said */
	uint64_t bytes;            /* what it put in quarantine: footprints no hold kept before */
	LIST_ENTRY(reg_hold) link; /* registry.holds */
	uint32_t n;
	struct tensor *t[]; /* n: one per lease, each a reference on its tensor */
};

RB_HEAD(tensor_names, tensor);
RB_HEAD(reg_tombs, reg_tomb);
TAILQ_HEAD(reg_tomb_age, reg_tomb);

/* One change a commit step made: a name published or unlinked. */
enum reg_change_kind { REG_PUBLISHED = 1, REG_UNLINKED = 2 };

struct reg_change {
	enum reg_change_kind kind;
	uint64_t generation; /* published: the new one; unlinked: the last one */
	uint64_t commit;
	uint32_t owner_uid, owner_gid, mode; /* who may read it */
	const struct tensor *tensor;         /* published: the tensor; unlinked: NULL */
	/*
	 * The version that lost the name in this change and lives on because
	 * it is leased (replaced or unlinked), or NULL: the state logs it, so
	 * that its leases can be re-adopted after a restart.
	 */
	struct tensor *retired;
	size_t name_len;
	char name[TENSORD_NAME_MAX + 1];
};

struct registry {
	struct tensor_names names; /* named tensors in name order (List) */
	struct tensor **buckets;
	size_t n_buckets; /* power of two */
	size_t n_named;
	LIST_HEAD(, tensor) all; /* every live tensor, named or not */
	uint64_t n_tensors;
	uint64_t n_leases;
	uint64_t next_id;
	struct reg_device devices[REGISTRY_DEVICES_MAX];
	int n_devices;
	/*
	 * Versions (commit.c): the next commit id, the floor every name the
	 * daemon does not remember starts its generations above, the
	 * tombstones of unlinked names, and the changes of the step under way.
	 */
	uint64_t next_commit, gen_floor;
	struct reg_tombs tombs;
	struct reg_tomb_age tomb_age;
	size_t n_tombs, tombs_max;
	struct reg_change *changes; /* owned */
	size_t n_changes, cap_changes;
	uint64_t step_commit; /* the step's commit id; 0 until it takes one */
	bool step_lost;       /* a change of the step could not be kept (out of memory) */
	/*
	 * Called at the end of each step that published or unlinked names,
	 * with its changes in order (v and the tensors in it borrowed for the
	 * call; lost: some could not be kept). Set by main.c; NULL: nobody
	 * listens. It may call the registry (a woken attach takes its lease).
	 */
	void (*on_commit)(void *ctx, const struct reg_change *v, size_t n, bool lost);
	void *on_commit_ctx;
	/*
	 * Called with on_commit_ctx when a tensor whose retired_logged is set
	 * is freed (its last lease ended), before its memory is freed or
	 * returned to a ring. NULL: nobody listens.
	 */
	void (*on_retired_gone)(void *ctx, const struct tensor *t);
	/*
	 * Keeps the figures of metrics (metrics_keep_figures()); NULL: none.
	 * Called as a linked tensor t goes from state `from` to state `to`
	 * (0: not counted, that is, before it is linked and once it is freed),
	 * its allocated bytes changing by `bytes`. t is borrowed for the call.
	 */
	void (*on_figures)(void *ctx, const struct tensor *t, int from, int to, int64_t bytes);
	void *on_figures_ctx;
	/* Per-uid shares of tensors and bytes; borrowed; NULL: not counted. */
	struct quota *quota;
	/* list and stat show every tensor to everyone (--show-all-metadata). */
	bool show_all_metadata;
	LIST_HEAD(, reg_hold) holds; /* owned: every hold not yet ended */
	uint32_t n_holds;
	uint64_t visits; /* tensors and slots a closing client visited: work, for stats */
	/* Reserves held by all clients, and their bytes. */
	uint32_t n_reserves;
	uint64_t reserve_bytes;
	/*
	 * Recycled memory (docs/recycle.md): whether creates that ask may
	 * take it (--recycle, and the start-up probe of F_SEAL_FUTURE_WRITE);
	 * the free ring buffers of all clients and their bytes; creates that
	 * took one; buffers never recycled because a client forked.
	 */
	bool recycle;
	uint64_t next_ring_share; /* the last ring buffer's share id (REG_RING_SHARE | n) */
	uint32_t n_ring_free;
	uint64_t ring_free_bytes;
	uint64_t ring_hits, ring_tainted;
	/* The same for GPU allocations (CUDA VMM): free buffers, their bytes,
	 * creates that took one (no cuMemCreate, no export, no zeroing). */
	uint32_t n_gpu_ring_free;
	uint64_t gpu_ring_free_bytes, gpu_ring_hits;
	/* Set allocations (registry_arena.c) holding members, and their bytes. */
	uint32_t n_arenas;
	uint64_t arena_bytes;
	/* The same on GPUs (one device allocation each), allocating ones included. */
	uint32_t n_gpu_arenas;
	uint64_t gpu_arena_bytes;
	/* The restart hold (registry_readopt.c): restored tensors kept for
	 * their holders to re-adopt until the grace period ends; NULL: none. */
	struct reg_readopt *readopt; /* owned */
	uint32_t n_held;
	uint64_t readopted, held_freed; /* leases re-adopted; held tensors freed at the end */
};

/*
 * The share ids of ring buffers (docs/recycle.md): this bit and a
 * daemon-wide count, never reused, apart from slabs' (small counts).
 * Readers keep a ring buffer's descriptor and mapping across the versions
 * it holds, as they keep a slab's, and let go soon after their last lease
 * on it, since its memory goes when its writer gives it back.
 */
#define REG_RING_SHARE (1ull << 62)
/*
 * With REG_RING_SHARE: a GPU ring buffer (a CUDA VMM allocation its
 * writer's later versions reuse). Its readers keep their import and
 * mapping of it parked between versions, and send a lease's Release only
 * after the device finished what was queued on it (docs/recycle.md,
 * section 4). A GPU set's allocation has it when it recycles (a CUDA VMM
 * allocation whose put_many asked to), as a single version's does.
 */
#define REG_GPU_RING_SHARE (1ull << 61)

struct create_args {
	const char *name;
	size_t name_len;
	DLDataType dtype;
	int32_t ndim;
	const int64_t *shape;
	const int64_t *strides; /* NULL: compact */
	DLDevice device;
	uint32_t flags;
	uint32_t mode; /* 0: 0600 */
	bool replace;  /* unlink a tensor of this name rc owns, in the same step */
	bool shared;   /* immutable and written by the daemon: may share a slab */
	uint32_t tx;   /* nonzero: a member of rc's transaction tx (registry_tx_commit()) */
	/* Nonzero: rc's reserve of that id, which the create consumes whatever
	 * happens: the tensor's memory when it fits (t->from_reserve), else freed. */
	uint64_t reserve;
	/* Recycle (docs/recycle.md): memory of rc's ring; a free buffer
	 * first, and then the named reserve is left alone. */
	bool recycle;
	/* A set in one allocation (Create.arena_size, in_arena; registry_arena.c):
	 * with tx and recycle (host) or on a GPU whose backend has arenas, open
	 * the transaction's arena of this size, or go into the one it has open. */
	uint64_t arena_size;
	bool in_arena;
	/* The name is "@PEER/NAME" (td_remote_name_check()): a replica of
	 * another node's tensor, which only remote.c creates. */
	bool replica;
};

/*
 * A reserve for rc of at least size bytes (the host pool's size class of
 * it), ready memory that only rc will get a descriptor of: allocated and
 * zeroed, writable, sealed against growing. *ret is borrowed: valid until
 * a create names it, registry_unreserve() of it, or rc's close. -EINVAL for
 * a size outside REGISTRY_RESERVE_MIN .. REGISTRY_RESERVE_BYTES_MAX;
 * -EAGAIN when rc holds REGISTRY_RESERVES_MAX reserves or as many bytes,
 * or when the pool has no memory of that class ready (it is wanted then:
 * ask again later); -ENOSPC over the host's capacity or when only the
 * descriptor reserve is left; -EDQUOT over the uid's share of bytes or
 * descriptors.
 */
int registry_reserve(struct registry *reg, struct reg_client *rc, uint64_t size,
		     struct reg_reserve **ret, char *why, size_t why_len);

/* rc's reserve of that id, or NULL. Borrowed, as registry_reserve()'s. */
struct reg_reserve *registry_reserve_find(struct reg_client *rc, uint64_t id);

/* Frees rc's reserve of that id: 0, or -ESRCH when rc has none such. */
int registry_unreserve(struct registry *reg, struct reg_client *rc, uint64_t id);

/*
 * rc's process forked while holding leases (Release.forked): the memory of
 * every tensor rc holds a lease on now is never recycled, since a child
 * may read it without a lease (docs/recycle.md, "Fork"). Returns how many
 * tensors that marked.
 */
unsigned registry_forked(struct registry *reg, struct reg_client *rc);

/*
 * Restart (registry_restore.c, docs/restart.md): what a predecessor
 * published, put back before the daemon serves. A tensor's record, as the
 * state log kept it (borrowed for the call).
 */
struct reg_restore {
	const char *name;
	size_t name_len;
	DLDataType dtype;
	int32_t ndim;
	const int64_t *shape, *strides; /* ndim each, strides in elements */
	uint64_t nbytes, offset;        /* its bytes, where they start in its memory */
	uint32_t uid, gid, mode, flags;
	uint64_t generation, commit, created_ns;
	/* A version that had lost its name, held for re-adoption only: not named. */
	bool retired;
};

/*
 * Memory kept across the restart: fd (taken over whatever happens) of
 * size bytes, a memfd on the host (device_type kDLCPU) or a GPU
 * allocation's export on the device of that type whose UUID is uuid
 * (imported again by its backend's import_fd()), whose tensors belong to
 * uid, gid and mode: a set allocation with no writer, charged to uid, that
 * registry_restore_tensor() places tensors in. NULL with the reason (no
 * such device now, the import failed, out of memory).
 */
struct reg_arena *registry_restore_memory(struct registry *reg, int device_type,
					  const uint8_t uuid[16], int fd, uint64_t size,
					  uint32_t uid, uint32_t gid, uint32_t mode, char *why,
					  size_t why_len);

/*
 * Puts r back in the table, published and named (r->retired: unlinked,
 * under no name, only held for re-adoption), its bytes at r->offset of a:
 * 0, or -EINVAL (a layout that does not add up or fit), -EEXIST or
 * -ENOMEM, with the reason.
 */
int registry_restore_tensor(struct registry *reg, struct reg_arena *a, const struct reg_restore *r,
			    char *why, size_t why_len);

/* No more tensors go into a: it is freed with its last (now, if it has none). */
void registry_restore_memory_done(struct registry *reg, struct reg_arena *a);

/*
 * The versions a predecessor reached: commit ids continue above
 * next_commit - 1, names the table does not remember above gen_floor, and
 * name, unlinked (or not restored) at generation, is remembered as a
 * tombstone, so that (name, generation) is never given out twice.
 */
void registry_restore_versions(struct registry *reg, uint64_t next_commit, uint64_t gen_floor);
void registry_restore_tomb(struct registry *reg, const char *name, size_t len, uint64_t generation,
			   uint64_t commit, uint32_t uid, uint32_t gid, uint32_t mode);

/*
 * The restart hold (registry_readopt.c, docs/restart.md): t, just
 * restored, is held until registry_readopt_end(); registry_readopt() gives
 * rc a lease on the held version (name, generation) if rc may read it:
 * 0, or -ENOENT (no such version held: the grace period is over, or it
 * was not restored), -EACCES, -EAGAIN (rc's leases are at their limit).
 * The end lets go of every held tensor: one whose name is gone and that
 * nobody leases is freed.
 */
void registry_readopt_hold(struct registry *reg, struct tensor *t);
int registry_readopt(struct registry *reg, struct reg_client *rc, const char *name,
		     uint64_t generation, uint64_t *ret_lease);
void registry_readopt_end(struct registry *reg);

/* Calls fn for every named, published tensor, in name order (fn must not change the table). */
void registry_each_published(struct registry *reg, void (*fn)(void *arg, struct tensor *t),
			     void *arg);
/* Calls fn for every tensor alive whose retired_logged is set (fn must not change the table). */
void registry_each_retired(struct registry *reg, void (*fn)(void *arg, struct tensor *t),
			   void *arg);

/* Transactions one client may have open at once. */
#define REGISTRY_TX_PER_CLIENT 16
/* Members and staged unlinks of one transaction, at most. */
#define REGISTRY_TX_MEMBERS_MAX (1u << 16)

/*
 * Sets up the registry and initialises every backend. host_capacity 0:
 * the host backend's default (half of physical memory). Never fails for
 * lack of a GPU: such backends answer -ENODEV later.
 */
int registry_init(struct registry *reg, uint64_t host_capacity);

/* Ends every hold left, then frees every tensor, whatever its leases. */
void registry_fini(struct registry *reg);

void registry_client_init(struct reg_client *rc, uint64_t id, uint32_t uid, uint32_t gid,
			  uint32_t pid);

/*
 * The client is gone: ends all its leases, unlinks its connection-lifetime
 * tensors and discards tensors it created but never published. Tensors
 * borrowed through rc's leases may be freed.
 */
void registry_client_gone(struct registry *reg, struct reg_client *rc);

/*
 * Before registry_client_gone(rc): moves rc's leases on legacy IPC memory
 * into a new hold (struct reg_hold), so that their tensors keep their
 * memory after rc is gone; its other leases are left for the close. The
 * hold, borrowed until registry_hold_end() (or registry_fini()), or NULL
 * when rc holds no such lease; out of memory too, which is logged, and
 * the leases then end with the others.
 */
struct reg_hold *registry_client_hold(struct registry *reg, struct reg_client *rc);

/*
 * The process of h's client has exited: ends h, whose tensors are let go
 * as its leases would have been (those nothing else holds are freed).
 */
void registry_hold_end(struct registry *reg, struct reg_hold *h);

/*
 * The calls below that take why return 0 or -errno and, on failure, write a
 * one-line reason naming the tensor into it.
 *
 * publish, attach and unlink take a valid name (td_name_check()) of len
 * bytes: dispatch checks every name a peer sends before it gets here.
 * create checks its name itself, the one place where a name enters the
 * table; the lookups take any bytes and simply find nothing.
 *
 * A tensor returned with a lease is borrowed: valid while that lease lives
 * (until registry_release() of it, or registry_client_gone() of rc).
 */

/*
 * Allocates the tensor, named and in state CREATED, and gives rc a new
 * lease on it (*ret_lease, held in rc's ledger). *ret_t is borrowed: valid
 * while that lease lives. -EINVAL for an invalid name, with the reason;
 * -EDQUOT over rc's uid's share of tensors or bytes; -ENOSPC over capacity
 * or when only the descriptor reserve is left (never -EMFILE).
 * With a->replace over a published tensor rc owns (or root), the new one is
 * that name's draft: the old one stays named until registry_publish() of
 * the draft swaps them in one step, and a draft that is never published
 * leaves it as it was. Over rc's own unpublished tensor, that one is
 * unlinked at once. -EPERM when rc does not own it, -EEXIST when another
 * client is still creating or replacing it.
 */
int registry_create(struct registry *reg, struct reg_client *rc, const struct create_args *a,
		    struct tensor **ret_t, uint64_t *ret_lease, char *why, size_t why_len);

/*
 * For a device whose backend's alloc() blocks (GPU), registry_create()
 * returns -EINPROGRESS instead of 0 once everything but the memory is done:
 * the name is taken (unless it replaces a tensor, which keeps the name
 * until its publish), capacity and rc's uid's shares are charged, and *ret_t is
 * pinned, in state CREATED with t->allocating set, and holds no lease yet.
 * The caller then runs registry_alloc_run() on the GPU worker and
 * registry_create_finish() back on this thread. Meanwhile the tensor may
 * be unlinked or its creator may go; it is not freed before the finish.
 */
struct reg_alloc_job {
	struct tensor *t;         /* borrowed; pinned until registry_create_finish() */
	struct backend_alloc got; /* what alloc() made; owned until the finish */
	int rc;                   /* alloc()'s result */
};

/* Allocates j->t's memory into j->got. Any one thread; reads only what never changes in t. */
void registry_alloc_run(struct reg_alloc_job *j);

/*
 * Completes the create of j->t: on success rc (t's creator) gets its lease
 * (*ret_lease) and t keeps j->got. 0, or -errno with the reason, and then t
 * is gone and what was allocated is released: the allocation failed, the
 * memory came out over capacity after rounding, the tensor was unlinked or
 * its creator went meanwhile (-ECANCELED). rc is the creator the caller answers, or NULL
 * when it went away (then the result is -ECANCELED).
 */
int registry_create_finish(struct registry *reg, struct reg_alloc_job *j, uint64_t *ret_lease,
			   char *why, size_t why_len);

/*
 * Publishes a tensor rc created (sealing it unless mutable) as the name's
 * next generation, in a commit step of its own (on_commit hears of it).
 * rc's draft of name comes first: publishing it unlinks the version it
 * replaces and names it, in one step. *ret_t (may be NULL) is the tensor
 * published, borrowed as registry_lookup()'s.
 */
int registry_publish(struct registry *reg, struct reg_client *rc, const char *name, size_t len,
		     struct tensor **ret_t, char *why, size_t why_len);

/*
 * A new lease on a published tensor, held in rc's ledger; *ret_t is
 * borrowed: valid while that lease lives. -ENOENT when the name is not
 * visible to rc (the caller may wait), -EACCES when its mode refuses rc.
 * *ret_writable says whether rc may write it.
 */
int registry_attach(struct registry *reg, struct reg_client *rc, const char *name, size_t len,
		    struct tensor **ret_t, uint64_t *ret_lease, bool *ret_writable, char *why,
		    size_t why_len);

/* The tensor rc's lease holds, or NULL when rc holds no such lease. Borrowed.
 */
struct tensor *registry_lease_tensor(struct reg_client *rc, uint64_t lease);

/* Ends one lease; it may free its tensor. -ESRCH when rc holds no such lease.
 */
int registry_release(struct registry *reg, struct reg_client *rc, uint64_t lease);

/*
 * Binding pages (registry_bind.c; docs/design.md, "Attach without a round
 * trip"): REG_PAGE_WORDS 64-bit words, word 0 counting clears, word i the
 * generation of slot i's binding or 0.
 */
#define REG_PAGE_WORDS 8192u

/*
 * rc's binding page, made on first use: *ret_fd is borrowed (the page's
 * own descriptor, sealed so that only the daemon's mapping writes it).
 * 0, or -errno with the reason in why (-ENOTSUP: the kernel cannot seal it).
 */
int registry_bind_page(struct reg_client *rc, int *ret_fd, uint32_t *ret_words, char *why,
		       size_t why_len);

/*
 * Binds rc's lease (just granted, on a published tensor) to a free slot of
 * rc's page and writes the slot's new generation. false (not bound): no
 * page, no free slot, or no memory; the lease is valid either way.
 */
bool registry_bind(struct reg_client *rc, uint64_t lease, uint32_t *ret_slot, uint64_t *ret_gen);

/*
 * t's refcount as clients see it (stat, list): its leases, each bound one
 * counted as the local leases its client serves from it (the client's half
 * of its page), not as one.
 */
uint32_t registry_refcount(const struct tensor *t);

/*
 * How many leases rc's lease in slot lease_slot stands for: 1, or for a
 * bound one the local leases its client says it serves (0 when idle).
 */
uint32_t registry_lease_weight(const struct reg_client *rc, uint32_t lease_slot);

/* Bindings rc's page holds now. */
uint32_t registry_bindings(const struct reg_client *rc);

/*
 * Wakes the client threads sleeping on the clear count of every page
 * cleared since the last call (one FUTEX_WAKE a page); the count of pages
 * woken. The slots themselves are cleared at once; the daemon's loop calls
 * this a millisecond after registry_bind_due() became true, well after the
 * replies and events of what cleared them went out and were read.
 */
unsigned registry_bind_wake(void);

/* Whether a page was cleared since the last registry_bind_wake(). */
bool registry_bind_due(void);

/*
 * Removes the name; the tensor lives on while leases hold it, else it is
 * freed. rc's draft of name comes first: it is discarded, and the version it
 * would have replaced stays. Another client's draft of an unlinked name
 * takes the name, unpublished.
 */
int registry_unlink(struct registry *reg, struct reg_client *rc, const char *name, size_t len,
		    char *why, size_t why_len);

/*
 * The named tensor as rc may see it (its creator before publish; after,
 * its owner, root and whoever its mode lets read, or everyone with
 * show_all_metadata), or NULL. Borrowed, and no lease holds
 * it: valid until the next registry call that can free a tensor (release,
 * unlink, client_gone).
 */
struct tensor *registry_lookup(struct registry *reg, struct reg_client *rc, const char *name,
			       size_t len);

/*
 * Whether rc may see who holds leases on t: its owner and root always, others
 * when t is published (or unlinked) and its mode lets them read it.
 */
bool registry_may_inspect(const struct tensor *t, const struct reg_client *rc);

/* Whether rc may read t (attach it): root, or t's mode for rc. */
bool registry_may_read(const struct tensor *t, const struct reg_client *rc);

/*
 * Whether uid (of group gid) may do perm (4 read, 2 write) to a tensor of
 * that owner and mode: root always, else by the owner, group or other bits.
 */
bool registry_mode_allows(uint32_t owner_uid, uint32_t owner_gid, uint32_t mode, uint32_t uid,
			  uint32_t gid, uint32_t perm);

/*
 * Whether rc may learn that a name changed (published or unlinked, its
 * generation and commit), the tensor having had that owner and mode: read
 * permission, as for an attach. The one rule for everything that tells of
 * changes and tombstones: watches (their events and replay) and
 * AttachMany's after= (which commits touched a set).
 */
bool registry_may_hear(uint32_t owner_uid, uint32_t owner_gid, uint32_t mode,
		       const struct reg_client *rc);

/* Whether a tensor of that name is published (whatever its mode). */
bool registry_published(struct registry *reg, const char *name, size_t len);

/* What clients are shown of t's version: a replica's origin's (docs/remote.md), else its own. */
static inline uint64_t tensor_shown_generation(const struct tensor *t)
{
	return t->origin_generation ? t->origin_generation : t->generation;
}

static inline uint64_t tensor_shown_commit(const struct tensor *t)
{
	return t->origin_generation ? t->origin_commit : t->commit;
}

/* The generation of the published tensor of that name (whatever its mode); 0: none. */
uint64_t registry_generation(struct registry *reg, const char *name, size_t len);

/* Names one List visits at most, shown or not: a page costs bounded work. */
#define REGISTRY_LIST_SCAN_MAX 65536

/*
 * One page of the tensors rc may see (as registry_lookup()) whose names
 * start with prefix (any bytes): at most limit of those whose names sort
 * after `after` (a NUL-terminated string, "" for the first page), in name
 * order, into ret[] (limit entries, the caller's). When more may follow,
 * *ret_next is the name to go on after (borrowed, like the tensors), else
 * NULL. Visits at most REGISTRY_LIST_SCAN_MAX names, from the first after
 * `after`, and allocates nothing.
 */
void registry_list(struct registry *reg, struct reg_client *rc, const char *prefix, size_t len,
		   const char *after, size_t limit, struct tensor **ret, size_t *ret_n,
		   const char **ret_next);

/*
 * Transactions (docs/design.md, "Transactions"): a create with a->tx makes
 * a member of rc's transaction tx, made on first use (as a create with
 * a->replace: a draft, or a new name held unpublished), which neither
 * publish nor unlink touch.
 *
 * registry_tx_unlink() stages an unlink of a published name rc may
 * unlink, for the commit. -ENOENT, -EPERM, -EINVAL (the name is a member
 * of the same transaction), or the limits of reg_tx_get().
 */
int registry_tx_unlink(struct registry *reg, struct reg_client *rc, uint32_t tx, const char *name,
		       size_t len, char *why, size_t why_len);

/*
 * Commits rc's transaction tx: every member published and every staged
 * name unlinked, in one step, with one commit id (*ret_commit; 0 for an
 * empty transaction, which takes none), on_commit hearing of them all at
 * once. A member that cannot be published (still allocating, cannot be
 * sealed) or a staged name that is gone or no longer rc's to unlink fails
 * it: -errno naming it, and the transaction is aborted. Either way the
 * transaction is over. -ENOENT: no such transaction.
 */
int registry_tx_commit(struct registry *reg, struct reg_client *rc, uint32_t tx,
		       uint64_t *ret_commit, uint32_t *ret_published, uint32_t *ret_unlinked,
		       char *why, size_t why_len);

/* Discards t, a member whose put failed, from its transaction, which goes on. */
void registry_tx_discard(struct registry *reg, struct tensor *t);

/* Discards every member of rc's transaction tx and forgets it. -ENOENT: none. */
int registry_tx_abort(struct registry *reg, struct reg_client *rc, uint32_t tx, char *why,
		      size_t why_len);

/*
 * The tombstone of name as rc may know it (registry_may_hear()): its last
 * generation and the commit that unlinked it. false when the name is
 * published, or was never, or was forgotten, or rc may not hear of it.
 */
bool registry_tomb(struct registry *reg, const struct reg_client *rc, const char *name, size_t len,
		   uint64_t *ret_generation, uint64_t *ret_commit);

/*
 * The newest commit that unlinked a remembered name under prefix that rc
 * may hear of (registry_may_hear()); 0: none.
 */
uint64_t registry_tombs_newest(struct registry *reg, const struct reg_client *rc,
			       const char *prefix, size_t len);

/* Calls fn with an unlinked change for each remembered name under prefix, in name order. */
void registry_tombs_each(struct registry *reg, const char *prefix, size_t len,
			 void (*fn)(void *arg, const struct reg_change *c), void *arg);

/* The device slot for dev, or NULL. */
struct reg_device *registry_device(struct registry *reg, DLDevice dev);

#endif
