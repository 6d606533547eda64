/*
 * tensord client library: share tensors between processes by name, zero copy.
 *
 * Conventions, for every function below:
 *  - 0 (or a count) on success, a negative errno value on failure
 *    (-ENOENT, -EEXIST, ...). tensord_strerror() names it, and
 *    tensord_last_error() gives the daemon's one-line message for the last
 *    failed call on the calling thread ("tensor 'x': no such tensor").
 *  - ret_* outputs are written only on success.
 *  - Names are 1 to 255 bytes of [A-Za-z0-9._:/-].
 *
 * Threads: a tensord_client may be used from several threads at once. Calls
 * are serialised on the socket but not on each other: a thread blocked in
 * tensord_attach() waiting for a publish does not hold up other threads'
 * calls on the same client. Deleters may run on any thread, any number of
 * them at once, and also after tensord_close().
 */
#ifndef TENSORD_TENSORD_H
#define TENSORD_TENSORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tensord/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define TENSORD_API __attribute__((visibility("default")))
#else
#define TENSORD_API
#endif

#define TENSORD_PROTOCOL_VERSION 1
#define TENSORD_NAME_MAX 255
/* A connection's label (tensord_connect_named()): at most this many bytes. */
#define TENSORD_LABEL_MAX 63
#define TENSORD_NDIM_MAX 32

typedef struct tensord_client tensord_client;

/* Bits of tensord_spec.flags and tensord_info.flags. */
enum {
	/* Stays writable by everyone allowed to attach it after publish. */
	TENSORD_MUTABLE = 1u << 0,
	/* Unlinked automatically when its creator's connection closes. */
	TENSORD_LIFETIME_CONNECTION = 1u << 1,
	/*
	 * tensord_create() and tensord_put() only, never a tensor's flag:
	 * the new tensor becomes the next version of a published tensor of
	 * that name the caller owns (root: any). The old one keeps the name
	 * and serves every attach until the new one is published, which swaps
	 * them in one daemon step, so the name is never missing; leases on
	 * the old one keep its bytes. If the new one is never published
	 * (tensord_unlink() of the name by its creator, a failed put, the
	 * connection closed), the old one stays as it was. -EPERM when another
	 * uid owns it, -EEXIST when another client is replacing it.
	 */
	TENSORD_REPLACE = 1u << 2,
	/*
	 * tensord_put() and tensord_put_many() only, never a tensor's flag:
	 * fresh memory sealed with F_SEAL_WRITE, as before recycling, instead
	 * of a buffer of this writer's ring (docs/recycle.md; also
	 * TENSORD_RECYCLE=0 in the environment, or the daemon's --recycle off).
	 * Then not even this process can write the published bytes again by
	 * raw system calls. A put of GPU memory then takes a fresh device
	 * allocation, not one of this writer's GPU ring.
	 */
	TENSORD_SEALED = 1u << 3,
	/*
	 * tensord_create() only, never a tensor's flag: a host tensor over
	 * 64 KiB goes into memory of this writer's earlier versions whose
	 * leases all ended, which the library keeps mapped (docs/recycle.md),
	 * so filling it costs no fault. Two things differ from a plain
	 * create: the bytes not written are an older version's, not zeroes,
	 * and the view is revoked at publish (read-only: a write through it
	 * afterwards faults, where a plain create's lands in a private copy;
	 * docs/security.md, "Recycled memory"). The view is not inherited by
	 * a fork() child. On a CUDA device over the VMM path the same holds
	 * for a CUDA allocation of this writer's earlier versions (the unwritten
	 * bytes an older version's; the view read-only after publish as any
	 * GPU creator's), and tensord_put() of a CUDA array asks for it itself
	 * unless TENSORD_SEALED, as tensord_put_many() does for its set's CUDA
	 * allocation (docs/recycle.md, section 0, "GPU rings").
	 */
	TENSORD_RECYCLE = 1u << 4,
};

typedef enum tensord_state {
	TENSORD_STATE_CREATED = 1,   /* only its creator sees it */
	TENSORD_STATE_PUBLISHED = 2, /* visible to every attach */
	TENSORD_STATE_UNLINKED = 3,  /* name gone; lives until the last lease ends */
} tensord_state;

/* What to create. shape and strides are borrowed for the call only. */
typedef struct tensord_spec {
	DLDataType dtype;
	int32_t ndim;           /* 0 .. TENSORD_NDIM_MAX */
	const int64_t *shape;   /* ndim entries, each >= 0; NULL when ndim == 0 */
	const int64_t *strides; /* in elements; NULL: row-major compact */
	DLDevice device;        /* {kDLCPU, 0}, {kDLCUDA, n}, {kDLROCM, n} */
	uint32_t flags; /* TENSORD_MUTABLE | TENSORD_LIFETIME_CONNECTION | TENSORD_REPLACE */
	uint32_t mode;  /* permission bits as for files; 0: 0600 */
} tensord_spec;

/* One tensor as the daemon describes it. */
typedef struct tensord_info {
	char name[TENSORD_NAME_MAX + 1];
	DLDataType dtype;
	int32_t ndim;
	int64_t shape[TENSORD_NDIM_MAX];
	int64_t strides[TENSORD_NDIM_MAX]; /* always filled, in elements */
	DLDevice device;
	uint64_t nbytes;      /* bytes the daemon allocated for it */
	uint64_t byte_offset; /* always 0 today */
	tensord_state state;
	uint32_t refcount; /* live leases */
	uint32_t owner_uid;
	uint32_t owner_gid;
	uint32_t mode;
	uint32_t flags;      /* TENSORD_MUTABLE | TENSORD_LIFETIME_CONNECTION */
	uint64_t created_ns; /* CLOCK_REALTIME, nanoseconds */
	uint64_t id;         /* unique for the daemon's life; never reused */
	/* Appended in ABI 1 (libtensord.so.1): this publish's generation of
	 * the name (1, 2, ...; never reused for the name while the daemon
	 * runs) and the daemon-wide commit that published it; 0 before publish. */
	uint64_t generation;
	uint64_t commit;
} tensord_info;

#define TENSORD_STATS_DEVICES_MAX 16

typedef struct tensord_device_stats {
	DLDevice device;
	char backend[16]; /* "host", "cuda", "hip" */
	char path[16];    /* how memory is shared: "memfd", "cuda-vmm", "cuda-ipc", "hip-ipc" */
	uint64_t bytes_used;
	uint64_t bytes_capacity;
	uint32_t tensors;
} tensord_device_stats;

/*
 * Daemon totals, versioned by size so that counters can be added without
 * breaking the ABI: fields are only ever appended (after devices[]; a new
 * per-device counter gets a new array at the end), callers pass
 * sizeof(tensord_daemon_stats) as they compiled it, and the library fills
 * what fits and sets .size to the bytes it wrote.
 */
typedef struct tensord_daemon_stats {
	uint32_t size; /* bytes filled by tensord_stats() */
	uint32_t daemon_pid;
	uint64_t tensors; /* named tensors plus unlinked ones still leased */
	uint64_t clients;
	uint64_t leases;
	uint64_t uptime_ns;
	uint32_t n_devices;
	tensord_device_stats devices[TENSORD_STATS_DEVICES_MAX];
	/* Appended in version 2 (size > TENSORD_STATS_SIZE_V1): */
	uint32_t daemon_fds;       /* descriptors the daemon holds open */
	uint32_t host_pool_fds;    /* of those, memfds the host pool keeps ready */
	uint64_t host_pool_bytes;  /* bytes allocated in them */
	uint64_t host_pool_budget; /* the most the pool keeps ready (--pool) */
	uint64_t host_pool_hits;   /* host creates served from the pool */
	uint64_t host_pool_misses; /* host creates of >= 1 MiB that found none ready */
	uint32_t host_slabs;       /* slab memfds shared by small immutable tensors */
	uint32_t reserved0;
	uint64_t host_slab_bytes; /* bytes in their live slots */
	/* Appended in version 3: per device (as devices[i]), the GPU memory the
	 * daemon costs it: its primary context (as NVML counted it when made;
	 * also while the daemon holds it after the last tensor went, see
	 * tensord(8) --gpu-context-hold) plus its allocations; 0 for host
	 * memory, when it holds nothing, or when unknown. */
	uint64_t device_gpu_bytes[TENSORD_STATS_DEVICES_MAX];
} tensord_daemon_stats;

/*
 * The daemon's figures: every number of its stats and metrics, each a name
 * and samples (see tensord_figures()). The daemon's table of them is
 * docs/operating.md's "Metrics"; new figures appear here without a new
 * library.
 */
typedef enum tensord_figure_type {
	TENSORD_FIGURE_COUNTER = 0, /* only grows while the daemon runs */
	TENSORD_FIGURE_GAUGE = 1,
	TENSORD_FIGURE_HISTOGRAM = 2,
} tensord_figure_type;

typedef enum tensord_figure_scope {
	TENSORD_SCOPE_DAEMON = 0, /* one sample */
	TENSORD_SCOPE_DEVICE = 1, /* one per device: labels device, backend, path first */
	TENSORD_SCOPE_UID = 2,    /* one per uid the caller may see: label uid first */
} tensord_figure_scope;

typedef enum tensord_figure_unit {
	TENSORD_UNIT_NUMBER = 0,
	TENSORD_UNIT_BYTES = 1,
	TENSORD_UNIT_SECONDS = 2,
} tensord_figure_unit;

typedef struct tensord_sample {
	const char *const *values; /* one per label of its figure, in that order */
	double value;              /* a histogram: the sum of what it observed */
	/* A histogram's buckets: n_bounds upper bounds (+Inf not among them),
	 * and n_bounds + 1 counts of observations per bucket, +Inf last (not
	 * cumulative). 0 and NULL for other figures. */
	size_t n_bounds;
	const double *bounds;
	const uint64_t *counts;
} tensord_sample;

typedef struct tensord_figure {
	const char *name; /* "host_pool_hits_total"; in Prometheus "tensord_" + name */
	const char *help;
	tensord_figure_type type;
	tensord_figure_scope scope;
	tensord_figure_unit unit;
	size_t n_labels;
	const char *const *labels; /* label names: the scope's, then its own */
	size_t n_samples;          /* may be 0 (no device, no uid to show) */
	const tensord_sample *samples;
} tensord_figure;

/* What one uid holds in the daemon (see tensord_uid_usage()). */
typedef struct tensord_uid_stats {
	uint32_t uid;
	uint32_t clients;       /* connections */
	uint64_t tensors;       /* tensors it owns, named or still leased */
	uint64_t fds;           /* of those, tensors with a descriptor of their own */
	uint64_t bytes;         /* bytes of those tensors */
	uint32_t waiters;       /* attaches waiting for a publish */
	uint32_t fds_in_flight; /* descriptors sent to it and not yet received */
} tensord_uid_stats;

/* The size of the first tensord_daemon_stats; tensord_stats() wants at least this. */
#define TENSORD_STATS_SIZE_V1                                                                      \
	(offsetof(tensord_daemon_stats, devices) +                                                 \
	 TENSORD_STATS_DEVICES_MAX * sizeof(tensord_device_stats))

/*
 * Connects to the daemon at socket_path, or, when it is NULL, at
 * $TENSORD_SOCKET alone when that is set, else at the default path
 * (tensord_default_socket_path()) and then /run/tensord/tensord.sock.
 * Before sending anything it checks that the socket's directory, the socket
 * and the peer (SO_PEERCRED) belong to the caller's euid, root, or
 * $TENSORD_DAEMON_UID (a uid or a user name); a private default directory
 * must also be closed to others. -ECONNREFUSED: no daemon at any path
 * tried. -EACCES: the socket's mode or directory refuses the caller.
 * -EPERM: another uid owns the socket or its directory, or serves it.
 * -ENOTSOCK: the path is not a socket. -EPROTO: protocol mismatch.
 * tensord_last_error() names the path and the fix.
 * -EDQUOT or -EAGAIN: the daemon refused the connection (this uid's share
 * of connections, or all of them in use); tensord_last_error() says which.
 * On success *ret_client is owned by the caller; free it with tensord_close().
 */
TENSORD_API int tensord_connect(const char *socket_path, tensord_client **ret_client);

/*
 * tensord_connect() with a label for the connection, such as "rollout-1",
 * that `tensorctl clients` and `tensorctl leases` show (and
 * tensord_clients(), tensord_leases()): 1 to TENSORD_LABEL_MAX bytes of
 * printable ASCII without spaces. NULL: $TENSORD_CLIENT_NAME when that is
 * set and not empty, else none (tensord_connect() does the same). -EINVAL
 * for a label that is not valid, from the argument or the environment
 * (tensord_last_error() says which and why); nothing is sent then. A child
 * forked from the process connects anew with the same label.
 */
TENSORD_API int tensord_connect_named(const char *socket_path, const char *name,
				      tensord_client **ret_client);

/*
 * How many times the daemon went away (crashed, restarted) under this
 * client: its next request after that connects anew (docs/restart.md,
 * "Clients carry on"). A commit id or generation from before a change of
 * epoch means something to the new daemon only when its lineage is the
 * same (tensord_lineage()): a wait given one (attach_after, attach_many's
 * after) that sees the epoch change to a daemon of another lineage takes
 * the first version the new daemon has. No request.
 */
TENSORD_API unsigned tensord_epoch(tensord_client *client);

/*
 * The lineage of the daemon serving client (HelloReply.lineage): the same
 * across a restart that restored the tensors, with their generations and
 * commit ids (docs/restart.md); another after one that started empty. 0
 * from a daemon that predates it. No request.
 */
TENSORD_API uint64_t tensord_lineage(tensord_client *client);

/*
 * Whether the connection serving client was lost (the daemon crashed or
 * restarted) and not yet replaced: its next request connects anew. A quiet
 * connection is looked at for the daemon's end (one poll()). An errno such
 * as ECONNRESET from a call means the daemon went away only when this says
 * so (a daemon may answer with it about a peer). No request.
 */
TENSORD_API bool tensord_lost(tensord_client *client);

/*
 * What the calling thread is to an event loop, for the calls it makes
 * from now on (every thread starts TENSORD_THREAD_PLAIN). A loop's thread
 * never connects (docs/restart.md, section 0.2): a put, put_many or
 * unlink made on a TENSORD_THREAD_LOOP thread whose connection is lost
 * fails with its errno (-ECONNRESET, -EPIPE) instead of reconnecting, and
 * the client keeps it; the same call made again on a
 * TENSORD_THREAD_LOOP_WORKER thread (the loop's worker) reconnects, asks
 * the daemon whether the kept one took effect, and returns its result or
 * does it again, never twice (section 5). No request.
 */
enum {
	TENSORD_THREAD_PLAIN = 0,
	TENSORD_THREAD_LOOP = 1,
	TENSORD_THREAD_LOOP_WORKER = 2,
};
TENSORD_API void tensord_thread_role(int role);

/*
 * Closes the connection; the daemon ends every lease this client still holds
 * and unlinks its connection-lifetime tensors. Host and CUDA VMM mappings
 * stay valid until each tensor's deleter runs. GPU memory the daemon exports
 * itself (legacy CUDA IPC, HIP) is unmapped here first, before the daemon can
 * free it: those tensors' data pointers must not be used after this call
 * (docs/gpu.md). Deleters still run exactly once. NULL-safe; returns NULL.
 */
TENSORD_API tensord_client *tensord_close(tensord_client *client);

/*
 * Writes the default socket path into buf: the one tensord listens on when
 * this user starts it with no --socket, and the first a client tries.
 * $TENSORD_SOCKET, else $XDG_RUNTIME_DIR/tensord.sock, else
 * /run/tensord/tensord.sock for root, else $TENSORD_TMPDIR/tensord-$UID/tensord.sock
 * ($TENSORD_TMPDIR defaults to /tmp). 0 or -ENAMETOOLONG.
 */
TENSORD_API int tensord_default_socket_path(char *buf, size_t len);

/*
 * Creates a tensor in the created state and returns it, writable, to the
 * caller. Nobody else sees it until tensord_publish(). spec is borrowed
 * for the call. On success *ret_tensor is owned by the caller and holds
 * one lease; its deleter ends it and must run exactly once, from any
 * thread, also after tensord_close().
 * -EEXIST, -EINVAL (name, dtype, shape or strides), -ENOSPC, -ENODEV,
 * -EDQUOT (over this uid's share of tensors or bytes; the message names it).
 */
TENSORD_API int tensord_create(tensord_client *client, const char *name, const tensord_spec *spec,
			       DLManagedTensorVersioned **ret_tensor);

/*
 * Makes a created tensor visible. Unless it was created TENSORD_MUTABLE it
 * becomes immutable: the creator's own earlier views keep working, but a
 * write through them afterwards lands in a private copy that nobody else
 * sees. -ENOENT, -EPERM (not the creator), -EBUSY (writable mappings of it
 * exist outside this library, e.g. in a forked child).
 */
TENSORD_API int tensord_publish(tensord_client *client, const char *name);

/*
 * Attaches a published tensor, zero copy. timeout_ms: 0 fails at once with
 * -ENOENT when the name is not published; -1 waits forever; otherwise waits
 * up to that long and fails with -ETIMEDOUT. The result has
 * DLPACK_FLAG_BITMASK_READ_ONLY set unless the tensor is mutable and the
 * caller may write it. -EACCES when its mode refuses the caller.
 * On success *ret_tensor is owned by the caller and holds one lease; its
 * deleter ends it and must run exactly once, from any thread, also after
 * tensord_close(). A name this client attached before, and which still
 * means the same tensor, is attached without asking the daemon (well under
 * 2 us); an unlink or replace that returned before the call is always seen
 * (docs/design.md, "Attach without a round trip"; TENSORD_BIND=0 turns it
 * off).
 */
TENSORD_API int tensord_attach(tensord_client *client, const char *name, int timeout_ms,
			       DLManagedTensorVersioned **ret_tensor);

/*
 * The same, as a pre-1.0 DLManagedTensor for consumers that want one.
 * On success *ret_tensor is owned by the caller and holds one lease; its
 * deleter ends it and must run exactly once, from any thread, also after
 * tensord_close().
 */
TENSORD_API int tensord_attach_legacy(tensord_client *client, const char *name, int timeout_ms,
				      DLManagedTensor **ret_tensor);

/*
 * create + copy + publish in one call. src may be host memory (kDLCPU,
 * pinned or managed), with any strides, stored row-major compact; or GPU
 * memory on the device the tensor is created on (this process's ordinal),
 * contiguous, copied device to device on CUDA's legacy default stream or
 * ROCm's null stream, which the caller must make wait for its writes
 * (DLPack's consumer stream 1 or 0; the Python put() asks the producer to).
 * Small host tensors travel inside the request (one round trip).
 * flags: TENSORD_MUTABLE, TENSORD_LIFETIME_CONNECTION, TENSORD_REPLACE (put
 * over a name the caller owns), TENSORD_SEALED (fresh memory, never one of
 * this writer's earlier versions'; a put of GPU memory on the CUDA VMM path
 * otherwise reuses them once their leases ended: docs/recycle.md, "GPU
 * rings"). src is borrowed for the call; no lease
 * outlives it. -EFAULT, before anything is sent, when src's bytes cannot
 * be where it says: a NULL data pointer for a non-empty tensor, a
 * byte_offset or strides that run past either end of the address space,
 * or host memory not mapped in this process. When the daemon goes while
 * it is under way, it is never applied twice (docs/restart.md, section
 * 5): it reconnects, asks a daemon of the same lineage whether it took
 * effect and returns as its reply would have, or puts again from src
 * (which must still hold the bytes: it is borrowed until the call
 * returns).
 */
TENSORD_API int tensord_put(tensord_client *client, const char *name, const DLTensor *src,
			    uint32_t flags, uint32_t mode);

/*
 * Removes the name; memory lives until the last lease ends. -ENOENT,
 * -EPERM. Lost with the daemon while under way: asked about and done
 * again only if it did not take effect; -ENOENT from a daemon that
 * restarted empty (docs/restart.md, section 5).
 */
TENSORD_API int tensord_unlink(tensord_client *client, const char *name);

/*
 * Versions, sets, waits and watches (docs/design.md, "Versions, sets and
 * watches"). Every publish of a name makes its next generation; every
 * step that changes names (a publish, an unlink, a transaction's commit)
 * takes the next daemon-wide commit id.
 */
typedef struct tensord_version {
	uint64_t generation; /* of the name: 1, 2, ... */
	uint64_t commit;     /* daemon-wide */
} tensord_version;

/*
 * tensord_publish(); *ret_version (NULL: not wanted) gets the generation
 * and commit made. Lost with the daemon while under way: the recorded
 * result when it took effect, else -ECONNRESET saying the draft was lost
 * (it died with its connection; docs/restart.md, section 5).
 */
TENSORD_API int tensord_publish_version(tensord_client *client, const char *name,
					tensord_version *ret_version);

/* tensord_put(); *ret_version (NULL: not wanted) gets the generation and commit made. */
TENSORD_API int tensord_put_version(tensord_client *client, const char *name, const DLTensor *src,
				    uint32_t flags, uint32_t mode, tensord_version *ret_version);

/*
 * tensord_attach() of a generation of name newer than after (0: any): at
 * once when one is published, else waits for one (timeout_ms as
 * tensord_attach(): 0 fails at once, with -ETIMEDOUT when the name is
 * published but not newer; -1 waits forever).
 */
TENSORD_API int tensord_attach_after(tensord_client *client, const char *name, uint64_t after,
				     int timeout_ms, DLManagedTensorVersioned **ret_tensor);

/*
 * A transaction: creates, puts and unlinks staged on one connection and
 * made visible by tensord_tx_commit() in one daemon step with one commit
 * id, or not at all (tensord_tx_abort(), a failed commit, the connection
 * closed). A transaction is used from one thread at a time. Up to 16 are
 * open per client.
 */
typedef struct tensord_tx tensord_tx;

/* A new transaction on client (no round trip). On success *ret_tx is the caller's. */
TENSORD_API int tensord_tx_begin(tensord_client *client, tensord_tx **ret_tx);

/*
 * tensord_create() as a member of tx: the caller writes it through
 * *ret_tensor (the caller's, as tensord_create()'s), and the commit
 * publishes it. TENSORD_REPLACE in spec->flags makes it the next version
 * of a published name. The transaction holds a reference to the client.
 */
TENSORD_API int tensord_tx_create(tensord_tx *tx, const char *name, const tensord_spec *spec,
				  DLManagedTensorVersioned **ret_tensor);

/* tensord_put() as a member of tx (src borrowed for the call). */
TENSORD_API int tensord_tx_put(tensord_tx *tx, const char *name, const DLTensor *src,
			       uint32_t flags, uint32_t mode);

/* Stages the unlink of a published name, checked now and done at the commit. */
TENSORD_API int tensord_tx_unlink(tensord_tx *tx, const char *name);

/*
 * Publishes every member and unlinks every staged name in one daemon step;
 * *ret_commit (may be NULL) gets the commit id (0 when nothing was
 * staged). On failure (a member that cannot be published, a staged name
 * gone) nothing is visible and the transaction is aborted. Either way tx
 * is over (its handle stays valid for tensord_tx_free()). Tensors the
 * caller holds from tensord_tx_create() stay valid (their leases). Lost
 * with the daemon while under way: its recorded commit when it took
 * effect, else -ECONNRESET saying the members were lost.
 */
TENSORD_API int tensord_tx_commit(tensord_tx *tx, uint64_t *ret_commit);

/* Discards every member and staged unlink; tx is over. */
TENSORD_API int tensord_tx_abort(tensord_tx *tx);

/* Frees tx, aborting it when it is still open. NULL-safe; returns NULL. */
TENSORD_API tensord_tx *tensord_tx_free(tensord_tx *tx);

/* One tensor of tensord_put_many(): its name and source (both borrowed for the call). */
typedef struct tensord_put_item {
	const char *name;
	const DLTensor *src;
} tensord_put_item;

/*
 * Puts n tensors as one transaction (one commit, *ret_commit, may be
 * NULL), their requests pipelined: far fewer round trips than n puts.
 * flags and mode as tensord_put()'s, for every item. Lost with the daemon
 * while under way: applied once, as tensord_put() (the whole set again
 * when it did not take effect).
 */
TENSORD_API int tensord_put_many(tensord_client *client, const tensord_put_item *items, size_t n,
				 uint32_t flags, uint32_t mode, uint64_t *ret_commit);

/* The tensors of one tensord_attach_many(), all leased in one daemon step. */
typedef struct tensord_set {
	uint64_t commit; /* the newest commit among the members */
	size_t n;
	const char *const *names; /* n names, in name order */
	/* n tensors, each the caller's (its deleter runs once, as tensord_attach()'s);
	 * tensord_set_free() runs the deleter of every entry not set to NULL. */
	DLManagedTensorVersioned **tensors;
} tensord_set;

/*
 * Leases a set in one daemon step: the n_names names (names, each checked),
 * or, with names NULL, every published name under prefix the caller may
 * read. after (0: any): only once a commit newer than it touched the set
 * (published or unlinked one of its names). timeout_ms: 0 does not wait
 * (-ENOENT naming a listed name not published; -ETIMEDOUT when nothing
 * newer than after); -1 waits forever (for every listed name, and for a
 * newer commit); else up to that long (-ETIMEDOUT). On success *ret_set is
 * the caller's, freed with tensord_set_free().
 */
TENSORD_API int tensord_attach_many(tensord_client *client, const char *const *names,
				    size_t n_names, const char *prefix, uint64_t after,
				    int timeout_ms, tensord_set **ret_set);

/* Runs the deleters of set's tensors left in it and frees it. NULL-safe; returns NULL. */
TENSORD_API tensord_set *tensord_set_free(tensord_set *set);

/*
 * Checkpoint files: .safetensors, .npz (numpy.savez, compressed or not) and
 * .npy, read into tensors and written from them. The format is the path's
 * suffix unless tensord_file_options.format says otherwise.
 */
typedef enum tensord_file_format {
	TENSORD_FILE_AUTO = 0, /* from the suffix: .safetensors, .npz, .npy */
	TENSORD_FILE_NPY = 1,
	TENSORD_FILE_NPZ = 2,
	TENSORD_FILE_SAFETENSORS = 3,
} tensord_file_format;

/* Progress of a long import: bytes copied so far of total. Runs on the caller's thread. */
typedef void tensord_progress_fn(void *arg, uint64_t done_bytes, uint64_t total_bytes);

typedef struct tensord_file_options {
	/* tensord_put_file(): TENSORD_REPLACE (the next version of names the
	 * caller owns), TENSORD_MUTABLE, TENSORD_LIFETIME_CONNECTION. */
	uint32_t flags;
	/* tensord_put_file(): the tensors' permission bits (0: 0600);
	 * tensord_get_file(): the file's (0: 0666 less the umask). */
	uint32_t mode;
	tensord_file_format format;
	tensord_progress_fn *progress; /* NULL: none; called every 64 MiB or so */
	void *progress_arg;
} tensord_file_options;

/*
 * Imports every array of the file at path as one transaction: all of them
 * appear in one commit (*ret_commit, may be NULL) or none does. Array NAME
 * becomes the tensor prefix + NAME; prefix must be empty or end in a
 * separator ('/', '.', '_', ':' or '-'), else -EINVAL ("ck/x" would make
 * "ck/xweight"). A .npy file holds one array: prefix is then its whole
 * name. The file is checked whole (names, dtypes, shapes, that it holds
 * every byte its header promises: "truncated" when not) before anything is
 * created; each array is then read straight into its tensor (one copy).
 * safetensors' F8_E4M3, F8_E5M2, F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0, F6_E2M3,
 * F6_E3M2 and F4 become DLPack's float8/6/4 types (F4 with an even last
 * extent as torch's float4_e2m1fn_x2: two values a byte, half the extent).
 * opts may be NULL. On success, when ret_names is not NULL, *ret_names is
 * the caller's: *ret_n names in name order, one block freed with free().
 * Every error message names the file and, where there is one, the array.
 */
TENSORD_API int tensord_put_file(tensord_client *client, const char *prefix, const char *path,
				 const tensord_file_options *opts, uint64_t *ret_commit,
				 char ***ret_names, size_t *ret_n);

/*
 * Exports tensors as one file, all of them from one daemon step (one
 * consistent commit, as tensord_attach_many(); *ret_commit, may be NULL,
 * gets the newest commit among them): the n_names names (each stored under
 * its whole name), or with names NULL every published name under prefix
 * (stored without the prefix; the same separator rule as
 * tensord_put_file()). A .npy holds exactly one tensor. The file is
 * written beside path and renamed onto it: never half a file. Host tensors
 * only (-ENOTSUP for device memory); *ret_n (may be NULL) gets the count.
 */
TENSORD_API int tensord_get_file(tensord_client *client, const char *const *names, size_t n_names,
				 const char *prefix, const char *path,
				 const tensord_file_options *opts, uint64_t *ret_commit,
				 size_t *ret_n);

/*
 * tensord_get_file() into an open descriptor (a pipe, stdout), written in
 * order, never sought: opts->format must be TENSORD_FILE_NPY or
 * TENSORD_FILE_SAFETENSORS (a zip needs a file). Borrowed: fd, neither
 * closed nor synced.
 */
TENSORD_API int tensord_get_file_fd(tensord_client *client, const char *const *names,
				    size_t n_names, const char *prefix, int fd,
				    const tensord_file_options *opts, uint64_t *ret_commit,
				    size_t *ret_n);

/* What a watch reports. */
typedef enum tensord_event_kind {
	TENSORD_EVENT_PUBLISHED = 0, /* name's generation, in commit */
	TENSORD_EVENT_UNLINKED = 1,  /* name's generation unlinked, in commit */
	TENSORD_EVENT_LAGGED = 2,    /* events were dropped or coalesced before the next one */
	/*
	 * The watch's daemon went away and the one that answers now started
	 * empty (another lineage, tensord_lineage()): the commit ids and
	 * generations before this event mean nothing to it. The events after
	 * it are the new daemon's, from its start.
	 */
	TENSORD_EVENT_RESTARTED = 3,
} tensord_event_kind;

typedef struct tensord_event {
	tensord_event_kind kind;
	uint64_t generation;
	uint64_t commit;
	char name[TENSORD_NAME_MAX + 1]; /* "" for lagged and restarted */
} tensord_event;

typedef struct tensord_watch tensord_watch;

/*
 * Watches the names under prefix ("" or NULL: all) that the caller may
 * read: every commit after this call returns is reported, in order per
 * name. replay: first the current state of names committed after the
 * commit id after (0: every name). queue: events the daemon keeps for a watcher that does not read
 * (0: 1,024; at most 65,536); past it they are coalesced (the newest per
 * name) and a lagged event says so. The library keeps as many. On success
 * *ret_watch is the caller's (tensord_watch_close()).
 *
 * A watch outlives its daemon's restart (docs/restart.md, "Clients carry
 * on"): tensord_watch_next() connects anew and watches again. A daemon of
 * the same lineage (it restored the old one's names): a lagged event,
 * then a replay of what was committed after the newest event the watch
 * received, each name's newest version (nothing twice; versions between
 * come coalesced, as the lagged event says; a live watch that received
 * none yet goes on live). One of another lineage (it started empty): a
 * TENSORD_EVENT_RESTARTED event, then everything it has, replayed.
 */
TENSORD_API int tensord_watch_start(tensord_client *client, const char *prefix, bool replay,
				    uint64_t after, uint32_t queue, tensord_watch **ret_watch);

/*
 * The next event into *ret_event: waits up to timeout_ms (-1 forever; 0:
 * -EAGAIN at once when none is there). -ETIMEDOUT, or -errno when the
 * connection failed. A lost connection is followed by a new one (see
 * tensord_watch_start()), tried while no daemon answers for
 * TENSORD_RECONNECT_MS (30 s) in all, across calls, pausing 10 ms growing
 * to 100 ms (within the call's timeout); past it -ECONNREFUSED (nobody
 * answers) or the connection's -errno. With timeout_ms 0 (an event loop)
 * it never connects, since that waits for the daemon's Hello: while the
 * watch's connection is lost it gives -EAGAIN and tensord_watch_fd()
 * -ENOTCONN; call tensord_fd() (off the loop's thread: it connects anew)
 * and then this again, which watches on over the new connection. Threads
 * calling it on one watch take turns.
 */
TENSORD_API int tensord_watch_next(tensord_watch *watch, int timeout_ms, tensord_event *ret_event);

/*
 * The descriptor to poll for reading before tensord_watch_next(watch, 0,
 * ...): its connection's. -ENOTCONN once that connection was lost: call
 * tensord_watch_next() again in a while (it connects anew, and this then
 * gives the new connection's). No request.
 */
TENSORD_API int tensord_watch_fd(tensord_watch *watch);

/* Ends the watch. NULL-safe; returns NULL. */
TENSORD_API tensord_watch *tensord_watch_close(tensord_watch *watch);

/*
 * Event loops (asyncio and the like) drive waits without a thread each:
 * start the operation, poll the client's descriptor for reading, call
 * tensord_poll() when it is readable, and finish the operation once
 * tensord_op_done() says so. tensord_poll() also queues watch events, for
 * tensord_watch_next(watch, 0, ...). A client driven so should not also
 * wait in blocking calls from other threads.
 */
typedef struct tensord_op tensord_op;

/*
 * The descriptor to poll for reading: the connection serving now, a new
 * one when it was lost (connecting waits for the daemon's Hello, up to
 * TENSORD_RECONNECT_MS where a holder or systemd keeps the socket through
 * a restart: an event loop calls it off its thread when tensord_lost()).
 */
TENSORD_API int tensord_fd(tensord_client *client);

/*
 * Reads what the daemon sent, without blocking, and completes operations
 * and queues watch events with it: the number of operations completed, or
 * -errno when the connection failed (every operation then completes with
 * that error). It never connects anew: a lost connection stays its error
 * until tensord_fd() (or any request) replaces it.
 */
TENSORD_API int tensord_poll(tensord_client *client);

/* Starts tensord_attach_after() (after 0: a plain attach); never blocks. */
TENSORD_API int tensord_attach_start(tensord_client *client, const char *name, uint64_t after,
				     int timeout_ms, tensord_op **ret_op);

/* Starts tensord_attach_many(); never blocks. */
TENSORD_API int tensord_attach_many_start(tensord_client *client, const char *const *names,
					  size_t n_names, const char *prefix, uint64_t after,
					  int timeout_ms, tensord_op **ret_op);

/* Whether op has its answer. */
TENSORD_API bool tensord_op_done(const tensord_op *op);

/*
 * Asks the daemon to answer op with -ECANCELED now (a wait it parked is
 * dropped); op still completes through tensord_poll() (with its result,
 * if that came first). 0 or -errno.
 */
TENSORD_API int tensord_op_cancel(tensord_op *op);

/* The result of a done attach op, as tensord_attach_after()'s; frees op. */
TENSORD_API int tensord_attach_finish(tensord_op *op, DLManagedTensorVersioned **ret_tensor);

/* The result of a done attach_many op, as tensord_attach_many()'s; frees op. */
TENSORD_API int tensord_attach_many_finish(tensord_op *op, tensord_set **ret_set);

/*
 * Abandons op, done or not: a wait still parked is cancelled, and what it
 * brings is released when it comes. NULL-safe; returns NULL.
 */
TENSORD_API tensord_op *tensord_op_free(tensord_op *op);

/* Describes one tensor. -ENOENT (also for one the caller may not read). */
TENSORD_API int tensord_stat(tensord_client *client, const char *name, tensord_info *ret_info);

/*
 * Describes every tensor whose name starts with prefix (NULL or "": all) and
 * that the caller may see (its own, or one its mode lets it read), in name
 * order. The daemon answers in pages; this asks for each. On success *ret_infos is a malloc'ed array of *ret_count
 * entries, owned by the caller, who frees it with free() (also when
 * *ret_count is 0).
 */
TENSORD_API int tensord_list(tensord_client *client, const char *prefix, tensord_info **ret_infos,
			     size_t *ret_count);

/*
 * Daemon totals. size: sizeof(*ret_stats) as the caller compiled it; the
 * library writes at most that many bytes (see tensord_daemon_stats).
 * -EINVAL when size is below TENSORD_STATS_SIZE_V1. Filled from
 * tensord_figures() by name; the struct gets no new fields: new figures
 * are read with tensord_figures() or tensord_stats_json().
 */
TENSORD_API int tensord_stats(tensord_client *client, tensord_daemon_stats *ret_stats, size_t size);

/*
 * Every figure of the daemon, as the caller may see it (per-uid figures:
 * root sees every uid, others their own), in the daemon's order. On
 * success *ret_figures is one malloc'ed block of *ret_count figures with
 * everything they point to, owned by the caller, who frees it with free().
 * -EPROTONOSUPPORT from a daemon older than figures.
 */
TENSORD_API int tensord_figures(tensord_client *client, tensord_figure **ret_figures,
				size_t *ret_count);

/*
 * The daemon's figures as one JSON object, the shape Python's stats()
 * returns and `tensorctl stats --json` prints: a figure of the daemon is a
 * key (its name) with its value, or, with labels of its own, an object
 * keyed by their values (nested in label order); a histogram is
 * {"count": n, "sum": s, "buckets": {"<bound>": cumulative count, ...,
 * "+Inf": n}}; "devices" is a list of one object per device (its device,
 * backend and path, and each device figure by name), "uids" one per uid
 * ("uid", and each per-uid figure by name). Numbers are integers but for
 * figures in seconds. On success *ret_json is a malloc'ed, NUL-terminated
 * string owned by the caller (free()).
 */
TENSORD_API int tensord_stats_json(tensord_client *client, char **ret_json);

/* One connection's leases on one tensor, as tensord_leases() lists them. */
typedef struct tensord_lease_holder {
	char name[TENSORD_NAME_MAX + 1];
	uint64_t tensor_id;
	tensord_state state; /* an unlinked tensor is listed while it is leased */
	uint32_t pid;        /* the holder, as the kernel told the daemon (SO_PEERCRED) */
	uint32_t uid;
	uint32_t gid;
	char comm[16];     /* its command name (/proc/PID/comm) when it connected; "" if unknown */
	uint32_t count;    /* leases this connection holds on the tensor */
	uint64_t conn_id;  /* the connection, as tensord_clients() lists it */
	uint64_t since_ns; /* CLOCK_REALTIME when the oldest of them began */
	uint64_t held_ns;  /* how long that is ago */
	char label[TENSORD_LABEL_MAX + 1]; /* the holder's connection label; "" if none */
	uint64_t bytes;                    /* the tensor's size */
	uint64_t commit;                   /* the commit that published it; 0 if never */
} tensord_lease_holder;

/*
 * Who holds leases on name (NULL or "": on every tensor), one entry per
 * tensor and connection, ordered by tensor id, then connection. Lists only
 * tensors the caller may read (their owner and root see all). On success
 * *ret_holders is a malloc'ed array of *ret_count entries, owned by the
 * caller, who frees it with free() (also when *ret_count is 0). -EINVAL for
 * an invalid name; a valid name nobody holds gives 0 entries.
 */
TENSORD_API int tensord_leases(tensord_client *client, const char *name,
			       tensord_lease_holder **ret_holders, size_t *ret_count);

/* One client connection, as tensord_clients() lists it. */
typedef struct tensord_client_info {
	uint64_t conn_id;
	uint32_t pid;
	uint32_t uid;
	uint32_t gid;
	char comm[16];         /* command name when it connected; "" if unknown */
	char client[32];       /* what its library said when connecting ("libtensord") */
	uint64_t connected_ns; /* CLOCK_REALTIME */
	uint32_t leases;
	uint32_t waiters; /* attaches waiting for a publish */
	uint64_t tensors_created;
	uint64_t bytes_queued; /* replies its socket has not taken yet */
	uint64_t requests;
	char label[TENSORD_LABEL_MAX + 1]; /* its label (tensord_connect_named()); "" if none */
} tensord_client_info;

/*
 * The daemon's client connections, this one included, in connection order:
 * all of them for root, those of the caller's uid for anyone else. On
 * success *ret_clients is a malloc'ed array of *ret_count entries, owned by
 * the caller, who frees it with free().
 */
TENSORD_API int tensord_clients(tensord_client *client, tensord_client_info **ret_clients,
				size_t *ret_count);

/* One peer of the daemon (another node's tensord), as tensord_peers() lists it. */
typedef struct tensord_peer_info {
	char name[64];     /* the peer's node name */
	char address[272]; /* HOST:PORT it is dialled at, or where it connected from */
	char state[16];    /* "connecting", "authenticating", "up", "down", "refused" */
	char error[320];   /* the last error ("authentication failed: ..."); "" when none */
	uint64_t since_ns; /* CLOCK_REALTIME of the last change of state */
	uint64_t
		instance; /* its daemon's random id, new at each start; 0 before it authenticated */
	uint64_t bytes_in;
	uint64_t bytes_out;
	uint64_t connects; /* connections that came up */
	uint64_t failures; /* dials that failed, handshakes refused, connections lost */
	bool configured;   /* named with --peer; else it dialled in */
	bool dialled;      /* up over the connection this daemon dialled */
	/* Remote attach with it (docs/remote.md), since the daemon started: */
	uint64_t pulled;        /* replicas made of its tensors */
	uint64_t pulled_bytes;  /* their bytes, received over the data path */
	uint64_t pull_errors;   /* pulls from it that failed */
	uint64_t served;        /* its pulls this daemon answered with bytes */
	uint64_t served_bytes;  /* their bytes, sent */
	uint64_t replicas;      /* replicas of its tensors here now */
	uint64_t replica_bytes; /* their bytes */
} tensord_peer_info;

/*
 * The daemon's peers (docs/remote.md), in the order the daemon came to know
 * them, and in node (at least 64 bytes, may be NULL) this daemon's own
 * node name, "" while peering is off (then *ret_count is 0). Only root and
 * the daemon's own uid may ask: anyone else gets -EPERM. On success
 * *ret_peers is a malloc'ed array of *ret_count entries owned by the
 * caller, who frees it with free() (also when *ret_count is 0).
 */
TENSORD_API int tensord_peers(tensord_client *client, char *node, tensord_peer_info **ret_peers,
			      size_t *ret_count);

/* One --peers-dns name of the daemon, as tensord_peers_dns() lists it. */
typedef struct tensord_peer_dns_info {
	char host[272];       /* HOST:PORT as given */
	uint32_t addresses;   /* in its last good answer */
	uint32_t self;        /* of them, this daemon's own (never dialled) */
	uint64_t resolutions; /* answers that came, good or failed (one every 10 s) */
	uint64_t failures;    /* of them, those that failed */
	char error
		[320]; /* the last resolution's error ("cannot resolve ..."); "" when it succeeded */
} tensord_peer_dns_info;

/*
 * The daemon's --peers-dns names, in the order given: how their resolution
 * goes (the nodes found are tensord_peers()'). Who may ask, and the array's
 * ownership, as tensord_peers(); *ret_count is 0 when there are none.
 */
TENSORD_API int tensord_peers_dns(tensord_client *client, tensord_peer_dns_info **ret_dns,
				  size_t *ret_count);

/*
 * The daemon's metrics in the Prometheus text format 0.0.4, the text its
 * --metrics endpoint serves, with the per-uid rows tensord_stats() would
 * show the caller (root: every uid; others: their own). On success
 * *ret_text is a malloc'ed, NUL-terminated string owned by the caller, who
 * frees it with free().
 */
TENSORD_API int tensord_metrics(tensord_client *client, char **ret_text);

/*
 * What each uid holds, against the daemon's per-uid shares: every uid when
 * the caller is root, else the caller's own uid only. Filled from
 * tensord_figures() by name; tensord_uid_stats gets no new fields (an array
 * of it cannot grow): read new per-uid figures with tensord_figures(). On success
 * *ret_usage is a malloc'ed array of *ret_count entries in uid order,
 * owned by the caller, who frees it with free() (also when *ret_count is 0).
 */
TENSORD_API int tensord_uid_usage(tensord_client *client, tensord_uid_stats **ret_usage,
				  size_t *ret_count);

/*
 * Returns a second DLManagedTensorVersioned for the same lease as t (which
 * must come from this library; borrowed for the call). On success
 * *ret_tensor is owned by the caller. Each handle's deleter must run, once:
 * the lease ends when the deleters of t and of every share have all run.
 * Used by the Python module to hand one lease to several consumers.
 */
TENSORD_API int tensord_share(DLManagedTensorVersioned *t, DLManagedTensorVersioned **ret_tensor);

/*
 * Describes the tensor behind t (which must come from this library;
 * borrowed for the call) as it was when attached or created, without a
 * round trip. -EINVAL if t is not ours.
 */
TENSORD_API int tensord_tensor_info(const DLManagedTensorVersioned *t, tensord_info *ret_info);

/*
 * Whether a write through t's data pointer is refused by the hardware or
 * the OS here, now: 1 when t's mapping is read-only (an immutable CUDA
 * tensor attached, or created and published, over CUDA VMM, where the
 * driver granted PROT_READ access; a write faults on the device), 0 when
 * it is not. 0 for mutable tensors; for legacy CUDA IPC and HIP (no
 * read-only device mappings: the DLPack READ_ONLY flag is all there is);
 * where the driver refused PROT_READ and the library fell back to a
 * read-write mapping; and for host tensors, whose immutable attaches are
 * private copy-on-write mappings: a stray write is not refused but stays in
 * this process, never reaching the shared bytes (docs/gpu.md, "Read-only").
 * t must come from this library (borrowed for the call); -EINVAL if not.
 */
TENSORD_API int tensord_tensor_read_only_enforced(const DLManagedTensorVersioned *t);

/* "no such tensor", "tensor exists", ... for -ENOENT or ENOENT alike. */
TENSORD_API const char *tensord_strerror(int err);

/* "ENOENT", "EEXIST", ... for -ENOENT or ENOENT alike; "EUNKNOWN" otherwise. */
TENSORD_API const char *tensord_err_name(int err);

/* The message of the last failed call on this thread; "" when none. */
TENSORD_API const char *tensord_last_error(void);

/* Parses "float32", "bfloat16", "int8", ... into *ret. -EINVAL if unknown. */
TENSORD_API int tensord_dtype_parse(const char *s, DLDataType *ret);

/*
 * Writes the name of dt ("float32") or, for types with no name,
 * "dtype(code,bits,lanes)" into buf. Returns buf.
 */
TENSORD_API const char *tensord_dtype_name(DLDataType dt, char *buf, size_t len);

/* Parses "cpu", "cuda:N", "rocm:N" into *ret. -EINVAL otherwise. */
TENSORD_API int tensord_device_parse(const char *s, DLDevice *ret);

/* Writes "cpu", "cuda:0", ... into buf. Returns buf. */
TENSORD_API const char *tensord_device_name(DLDevice dev, char *buf, size_t len);

/* Whether memory of this device type is addressable from the CPU (kDLCPU and kin). */
TENSORD_API bool tensord_device_host_accessible(DLDeviceType type);

/* Whether this is a GPU device type tensord serves (kDLCUDA, kDLROCM). */
TENSORD_API bool tensord_device_is_gpu(DLDeviceType type);

/*
 * The stream tensord_put() copies a source of this device type on, as
 * DLPack numbers streams (1 for CUDA's legacy default stream, 0 for ROCm's
 * null stream), for a producer's __dlpack__(stream=...): the caller must make
 * that stream wait for its writes before the put. -1 for devices that take
 * no stream (the host).
 */
TENSORD_API long tensord_put_stream(DLDeviceType type);

/*
 * Whether a consumer may pass stream to __dlpack__(stream=...) of a tensor
 * on this device type, by DLPack's rules: -1 ("do not synchronise") always;
 * for a GPU its own stream numbers (1 and 2 for CUDA's default streams, 0
 * for ROCm's) and any stream handle above 2; nothing else.
 */
TENSORD_API bool tensord_stream_valid(DLDeviceType type, long stream);

#ifdef __cplusplus
}
#endif

#endif /* TENSORD_TENSORD_H */
