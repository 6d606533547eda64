/*
 * Internals of libtensord shared by its files. A tensord_client is a
 * connection (struct td_conn, transport.c; its life in lifecycle.c and
 * fork.c) and the cache of mappings its leases use (struct td_mapcache,
 * mapcache.c), under one lock. Leases and their DLPack handles are in
 * lease.c, the requests in requests.c.
 */
#ifndef TENSORD_CLIENT_H
#define TENSORD_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <tensord/tensord.h>

#include "bindings.h"
#include "common/sys.h"
#include "import.h"
#include "lease.h"
#include "mapcache.h"
#include "reserve.h"
#include "ring.h"
#include "proto/frame.h"
#include "proto/tensord.pb-c.h"

/* Descriptors one connection may hold unclaimed; see struct td_fdq. */
#define TD_FDQ (2 * TD_FRAME_MAX_FDS_REPLY)

/* One frame of a reply that comes in parts (AttachMany). */
struct td_part {
	Tensord__Reply *reply; /* owned */
	int *fds;              /* owned: n_fds descriptors in the frame's order */
	unsigned n_fds;
	struct td_part *next;
};

/*
 * A request waiting for its reply: on the stack of td_rpc(), or in an
 * operation (tensord_op) for event loops. Guarded by the client's lock.
 */
struct td_pending {
	uint64_t id;
	bool done;
	bool multi;            /* answered in parts (td_part) until one says no more */
	bool async;            /* an operation's: counted by tensord_poll() when done */
	bool abandoned;        /* its operation went: what it brings is let go */
	Tensord__Reply *reply; /* owned once done; NULL if the connection died or, multi, OK */
	int fd;                /* owned once done; -1 when none */
	struct td_part *parts; /* multi: owned, in order */
	struct td_part **tail;
	struct td_watch_q *watch; /* a Watch's queue, registered under the request's id */
	struct td_pending *next;
};

/* A watch's events as they came (stats.c's neighbour watch.c). */
struct td_watch_q;

/*
 * Received bytes not yet parsed. Only the reader touches it: the thread
 * that set td_conn.reading, or one that holds the lock while none has.
 */
struct td_rbuf {
	uint8_t *buf; /* owned */
	size_t len, cap;
};

/*
 * Descriptors received and not yet taken by a frame, in arrival order.
 * Each frame takes the n_fds its header counts from the head (PipeWire's
 * n_fds, proto/frame.h). Once a read's frames are delivered, what is left
 * belongs to the frame still arriving, at most TD_FRAME_MAX_FDS_REPLY, and
 * one read brings at most what read_some()'s control room holds.
 */
struct td_fdq {
	int fd[TD_FDQ]; /* owned: fd[0] .. fd[n - 1], oldest first */
	int n;
};

/* Releases deferred by deleters, at most this many (release.c). */
#define TD_RELQ_MAX 64
/* The most bytes one Release frame takes. */
#define TD_RELEASE_FRAME_MAX 32

/*
 * Releases that deleters queued instead of sending (release.c): they go out
 * in front of the next request, in the same send(), or after at most
 * TD_RELQ_DELAY_NS when no request comes. Guarded by td_conn.send_lock.
 */
struct td_relq {
	uint64_t ids[TD_RELQ_MAX];
	int n;
	uint64_t since_ns; /* CLOCK_MONOTONIC when the oldest was queued */
	bool running;      /* the flusher thread runs; else deleters send at once */
	bool armed;        /* the flusher is timing the queue: no need to wake it */
	bool stop;
	pthread_t thread;
	pthread_cond_t cond; /* with send_lock: something was queued, or stop */
	/* The flusher also expires parked mappings (mapcache.h) of maps. */
	struct td_mapcache *maps;
	bool sweep_kicked;  /* a mapping was parked while none was */
	uint64_t sweep_due; /* when the oldest parked mapping expires; 0: none */
	/* And gives back the client's idle ring buffers (ring.c) from then on; 0: none. */
	uint64_t ring_due;
	/*
	 * And, while the client holds leases (or did lately), looks every
	 * TD_LOST_CHECK_NS whether the daemon went, so that an idle client
	 * re-adopts its leases after a restart (readopt.c): when next, and
	 * when it last saw a lease. watching: it does, so that a lease need
	 * not wake it (a client's first lease after a while does, lease.c).
	 */
	uint64_t lost_due, live_ns;
	atomic_bool watching;
	/*
	 * Releases of leases on recycled GPU memory (td_release_after_sync()),
	 * sent by the flusher only once the devices they were on finished
	 * what was queued, and so never drained in front of a request; each
	 * with its device as this process numbers it.
	 */
	uint64_t sync_ids[TD_RELQ_MAX];
	DLDevice sync_devs[TD_RELQ_MAX];
	int n_sync;
	bool syncing; /* some thread waits for devices before sending those it took */
	/* When the next parked GPU import expires (import_gpu.h); 0: none. */
	uint64_t gpu_due;
};

/* The socket to the daemon and the exchange of frames on it. */
struct td_conn {
	int fd;                    /* owned; closed when the client's last reference goes */
	pthread_mutex_t send_lock; /* one frame at a time on the socket */
	/* The rest is guarded by the client's lock. */
	pthread_cond_t cond; /* a reply came, the reader stepped down, or the end */
	bool reading;        /* some thread is receiving for everyone */
	bool closed;         /* tensord_close() ran, or the connection died */
	int err;             /* why it died: -ECONNRESET, -EPROTO, ... */
	char why[256];       /* why it died, as calls report it; "" after tensord_close() */
	uint64_t next_id;
	uint32_t max_request;       /* the largest request frame the daemon takes (its Hello) */
	struct td_pending *pending; /* borrowed: a td_rpc() caller's, or an operation's */
	struct td_watch_q *watches; /* borrowed: each its watch's (watch.c) */
	unsigned completed;         /* async requests answered: tensord_poll() counts them */
	struct td_rbuf rx;
	struct td_fdq fdq;
	struct td_relq relq; /* guarded by send_lock, not by the client's lock */
	struct td_spin spin; /* how long to poll for a reply: the reader's alone */
	/* When a quiet connection was last looked at for the daemon's end (lifecycle.c). */
	_Atomic uint64_t checked_ns;
};

/* The last effecting request a thread sent, and to whom (idem.c). */
struct td_write_note {
	bool sent;
	uint64_t token, seq, instance, lineage;
};

struct tensord_client {
	atomic_uint refs;     /* the user's handle plus one per live lease */
	atomic_uint next_tx;  /* the last transaction id given out */
	pthread_mutex_t lock; /* guards conn (but its fd and send_lock), maps, successor */
	struct td_conn conn;
	struct td_mapcache maps;
	/* Leases on memory the daemon exports itself, for tensord_close() (lease.c). */
	LIST_HEAD(, td_lease) ipc_leases;
	/* Every lease that lives on this connection (lease.c, readopt.c), and how many. */
	LIST_HEAD(, td_lease) leases;
	atomic_uint n_live;
	struct td_reserve reserve;
	struct td_ring ring;
	struct td_bindings binds; /* attach without a round trip (bindings.c) */
	/*
	 * Fork (docs/design.md, "Fork"). inherited is set in a forked child,
	 * before any other thread exists there, and never cleared: the client
	 * then only serves the leases it had, and requests go to successor,
	 * the child's own connection to path, made on first use.
	 */
	char path[108];                    /* the socket it connected to */
	char label[TENSORD_LABEL_MAX + 1]; /* what Hello named it; "" for none */
	bool inherited;
	bool user_closed;          /* tensord_close() ran */
	tensord_client *successor; /* owned (the user's handle of it); NULL: none yet */
	/*
	 * How many times the daemon went away under this handle's connections:
	 * a successor made because the connection was lost counts one more
	 * than its predecessor (tensord_epoch()).
	 */
	unsigned epoch;
	/* HelloReply.lineage (tensord_lineage()); 0: the daemon sent none. */
	uint64_t lineage;
	/*
	 * Idempotent writes (idem.c): Hello.token, kept by a successor made
	 * because the connection was lost (a fork's child takes another), and
	 * the last Request.seq given out (guarded by lock; a successor goes on
	 * from its predecessor's).
	 */
	uint64_t token, seq;
	/*
	 * A write lost on an event loop's thread (tensord_thread_role()), kept
	 * for the same call made again on the loop's worker (idem.c). Guarded by lock;
	 * the user's handle's, never a successor's.
	 */
	struct td_held_write {
		bool valid;
		int kind;      /* enum td_write_kind */
		char what[96]; /* the call's description, which the same call matches */
		struct td_write_note note;
	} held;
	LIST_ENTRY(tensord_client) all_link; /* every live client of this process (fork.c) */
};

/*
 * The client that serves requests made on c in this process: c itself,
 * or, when c was inherited across fork() or its connection was lost (the
 * daemon crashed or restarted), a connection of this process's own to the
 * same path, connected on first use (*pc is replaced); -ECONNREFUSED when
 * no daemon answers there (yet). 0 or -errno
 * with the error set (the new connection failed, or c was closed). Every
 * public call that takes a client starts with it.
 */
int td_client_current(tensord_client **pc);

/* The same for a call that may be served without asking the daemon (a bound attach). */
int td_client_current_bound(tensord_client **pc);

/*
 * Whether c's connection was lost (the daemon closed it, crashed or
 * restarted), not closed by its user: td_client_current() then connects
 * anew, and the client's successor serves from then on.
 */
bool td_client_lost(tensord_client *c);

/*
 * The connection serving c now (the last of its successors), made by
 * nobody: lost or not, as it is. For calls that must not connect (an
 * event loop's tensord_poll()).
 */
tensord_client *td_client_latest(tensord_client *c);

/*
 * A wait (an attach, an attach_many), or a request that changes nothing
 * (timeout_ms 0: a read), across a lost connection: begun with the
 * caller's client and timeout; after a failure r, td_retry_again() says
 * whether to try again over a new connection: r says the daemon went
 * away, no daemon has failed to answer for TENSORD_RECONNECT_MS (30 s;
 * a read 2 s at most) since, a wait has time left of its timeout, and a
 * read was not sent again yet (once). It has connected (pausing 10 ms
 * growing to 100 ms while no daemon answers) and set *timeout_ms to what
 * is left.
 */
struct td_retry {
	tensord_client *c;
	unsigned epoch;   /* tensord_epoch() when the wait began */
	unsigned seen;    /* tensord_epoch() when this try began */
	uint64_t lineage; /* tensord_lineage() when the wait began */
	uint64_t start_ns;
	uint64_t lost_ns; /* when the daemon stopped answering; 0: it answers */
	int timeout_ms;
	unsigned tries;  /* connect attempts since lost_ns */
	unsigned resent; /* times the request went again */
};
void td_retry_begin(struct td_retry *rt, tensord_client *c, int timeout_ms);

/*
 * after as cur, the connection serving now, understands it: 0 when the
 * daemon went away since the wait rt began and the one serving now is of
 * another lineage (it started empty, so its commit ids and generations
 * start anew); after itself when it restored its predecessor's state
 * (docs/restart.md).
 */
uint64_t td_after_for(const tensord_client *cur, const struct td_retry *rt, uint64_t after);
bool td_retry_again(struct td_retry *rt, int r, int *timeout_ms);

/*
 * A request that changes nothing (stat, list, stats, leases, clients,
 * ...): call(c, arg) whole, and once more over a new connection when the
 * daemon went away meanwhile (td_retry, timeout 0). Requests that may
 * have taken effect (put, publish, commit, unlink) go through td_write()
 * instead, which asks the daemon before doing anything again.
 */
int td_read(tensord_client *c, int (*call)(tensord_client *c, void *arg), void *arg);

/*
 * Whether r says the daemon went away: nobody answers at its path
 * (-ECONNREFUSED), or the connection serving c was lost (tensord_lost())
 * or replaced since epoch seen. The same errno in a reply, about a peer's
 * connection, is the daemon's answer, not a loss.
 */
bool td_gone(tensord_client *c, int r, unsigned seen);

/* idem.c: a random, nonzero client token (Hello.token). */
uint64_t td_token_new(void);

/*
 * idem.c: an effecting request (a put, publish, commit or unlink outside a
 * transaction) about to be sent on c gets the token's next seq, and is
 * noted as this thread's last write. Lock held.
 */
void td_idem_stamp(tensord_client *c, Tensord__Request *req);

/* What a write that lost its connection may do again (td_write()). */
enum td_write_kind {
	TD_WRITE_PUT = 1, /* a put or put_many: done again from the caller's source */
	TD_WRITE_UNLINK,  /* done again; another lineage's daemon: ENOENT */
	TD_WRITE_DRAFT,   /* a user's publish or commit: its draft died with the connection */
};

/*
 * idem.c: call(c, arg), and when the connection was lost under it
 * (td_gone()), within the reconnect grace: the daemon asked what became
 * of the last effecting request it sent (Resolve); applied: 0, with
 * *ret_version and *ret_commit (each NULL: not wanted) what its reply
 * said; not applied, or lost before it went: call() again (kind PUT,
 * UNLINK) or the loss (DRAFT, -ECONNRESET, naming what). Never twice.
 * What the write is (about) is formatted only when a loss needs it: a
 * write that goes through pays no snprintf().
 */
struct td_what {
	const char *name; /* "tensor 'name': verb"; NULL: verb says it all */
	const char *verb;
};
int td_write(tensord_client *c, enum td_write_kind kind, struct td_what about,
	     int (*call)(tensord_client *c, void *arg), void *arg, tensord_version *ret_version,
	     uint64_t *ret_commit);

/*
 * requests.c: a Publish and an Unlink, once, not retried (put.c's own and
 * its discards). The publish goes on c's own connection (td_rpc_on()).
 */
int td_publish(tensord_client *c, const char *name, tensord_version *ret_version);
int td_unlink(tensord_client *c, const char *name);

/* How long to go on reaching a daemon that went away: TENSORD_RECONNECT_MS, else 30 s. */
uint64_t td_reconnect_grace_ms(void);

/* The pause before connect attempt tries + 1 while nobody answers: 10 ms growing to 100 ms. */
unsigned td_reconnect_pause_ms(unsigned tries);

/*
 * connect.c: connects to socket_path, or with NULL to the first default
 * path a daemon answers on, and checks who owns and serves it. A connected
 * descriptor (the caller's), or -errno with the error set; ret_path gets
 * the path tried (the first default when none answered).
 */
int td_connect_socket(const char *socket_path, char *ret_path, size_t len);

/*
 * Round trip: sends req (its id is set here; otherwise borrowed for the
 * call) and waits for its reply. On success *ret_reply is owned by the
 * caller (free it with tensord__reply__free_unpacked()), and so is *ret_fd
 * (-1 when none; when ret_fd is NULL a descriptor is closed here). On
 * failure -errno with the error message set. A reply with a negative
 * status is returned as that status, message set.
 */
int td_rpc(tensord_client *c, Tensord__Request *req, Tensord__Reply **ret_reply, int *ret_fd);

/*
 * td_rpc() on c's own connection, never a successor's: a request about
 * what lives in that connection (a draft's publish, a transaction's
 * commit) fails with the connection's error when it was lost.
 */
int td_rpc_on(tensord_client *c, Tensord__Request *req, Tensord__Reply **ret_reply, int *ret_fd);

/*
 * The halves of td_rpc(), for requests answered in parts, pipelined, or
 * completed by an event loop. td_rpc_start() sets req's id, registers p
 * (zeroed by the caller but for multi and async; it must stay where it is
 * until td_rpc_end()) and sends. 0 or -errno with the error set (p is not
 * registered then). c must be the client td_client_current() chose.
 */
int td_rpc_start(tensord_client *c, Tensord__Request *req, struct td_pending *p);

/* Waits until p is answered (reading for everyone when nobody else is). 0 or -errno. Lock not held. */
int td_rpc_wait(tensord_client *c, struct td_pending *p);

/*
 * Unregisters p, answered or not, and says how it ended: 0, the reply's
 * negative status (error set), or the connection's error. What p holds
 * stays the caller's (td_pending_clear()). Lock not held.
 */
int td_rpc_end(tensord_client *c, struct td_pending *p);

/* Frees what p holds: its reply, descriptor and parts. */
void td_pending_clear(struct td_pending *p);

/*
 * Reads what the socket has without blocking and delivers it, unless
 * another thread is the reader. The number of async requests answered
 * meanwhile, or -errno when the connection is gone.
 */
int td_poll(tensord_client *c);

/*
 * A watch registers its queue with the connection: frames with its id
 * (past the Watch reply) are its events. Lock held for both.
 */
void td_watch_register(struct td_conn *conn, struct td_watch_q *q);
void td_watch_unregister(struct td_conn *conn, struct td_watch_q *q);

/* watch.c: events arrived for the watch with id (Lock held); true when one has it. */
bool td_watch_deliver(struct td_conn *conn, const Tensord__Reply *rep);

/* watch.c: q takes id (the Watch request's). Lock held. */
void td_watch_set_id(struct td_watch_q *q, uint64_t id);

/*
 * Waits until something arrives for anyone (delivered, by this thread as
 * the reader or by another), or timeout_ms passes (-1: no limit). 0 or the
 * connection's -errno. Lock not held.
 */
int td_wait_event(tensord_client *c, int timeout_ms);

/*
 * The Create round trip of tensord_create(), without mapping anything: on
 * success *ret_reply is a Lease reply (with its tensor), owned by the
 * caller (tensord__reply__free_unpacked), and so is *ret_fd (-1 when
 * none). The lease it grants is the caller's to end (td_lease_end).
 */
int td_create_rpc(tensord_client *c, const char *name, const tensord_spec *spec, uint32_t tx,
		  uint64_t reserve, bool recycle, Tensord__Reply **ret_reply, int *ret_fd);

/*
 * requests.c: a member of transaction tx created as tensord_create() creates
 * (c chosen already); *ret_tensor is the caller's. tensord_tx_create() and
 * a put in a transaction (put.c) call it.
 */
int td_tx_create_raw(tensord_client *c, uint32_t tx, const char *name, const tensord_spec *spec,
		     DLManagedTensorVersioned **ret_tensor);

/*
 * The same for a GPU member of put_many's set in one allocation
 * (docs/recycle.md, section 5): arena_size nonzero opens the set's
 * allocation of that many bytes, in_arena goes into it (Create.arena_size,
 * in_arena); the daemon places it elsewhere when it cannot. The opening
 * asks to recycle when spec does (TENSORD_RECYCLE, td_ring_gpu()): the
 * allocation may be a GPU ring buffer of this writer's (docs/recycle.md,
 * section 0, "GPU rings").
 */
int td_tx_create_arena(tensord_client *c, uint32_t tx, const char *name, const tensord_spec *spec,
		       uint64_t arena_size, bool in_arena, DLManagedTensorVersioned **ret_tensor);

/*
 * copy.c: copies n bytes from src (readable: the caller checked) to dst,
 * with the copy pool's helper threads when n is large and this process may
 * run on two CPUs or more (docs/recycle.md, section 7).
 */
void td_copy(uint8_t *dst, const uint8_t *src, size_t n);

/* One part of a copy job: n bytes from src to dst. */
struct td_copy_part {
	void *dst;
	const void *src;
	size_t n;
};

/*
 * The same for n parts at once (a put_many's members): one job, its
 * chunks numbered across the parts, so helpers wake once for the set.
 */
void td_copy_many(const struct td_copy_part *parts, size_t n);

/* release.c: the flusher should call td_ring_sweep() at due (CLOCK_MONOTONIC). */
void td_relq_ring_due(struct td_conn *conn, uint64_t due);

/* The parts of a Create request, all pointing into the caller's arguments. */
struct create_msg {
	Tensord__Create cr;
	Tensord__DType dt;
	Tensord__Device dev;
	uint8_t uuid[16];
};

/* A Create request ready to send (td_rpc_start()), for pipelining. */
struct td_create_req {
	Tensord__Request req;
	struct create_msg m;
};

/* Fills cm with the create of name (spec and name borrowed while cm is used). 0 or -errno. */
int td_create_msg(struct td_create_req *cm, const char *name, const tensord_spec *spec, uint32_t tx,
		  bool recycle);

/* A Put request ready to send. */
struct td_put_msg {
	Tensord__Request req;
	Tensord__Put put;
	struct create_msg m;
};

/*
 * Fills pm with the put of name's len bytes (all borrowed while pm is
 * used); -EMSGSIZE when they do not fit in one request of max bytes (the
 * connection's max_request).
 */
int td_put_msg(struct td_put_msg *pm, const char *name, const tensord_spec *spec, uint32_t tx,
	       const void *data, size_t len, uint32_t max);

/* The generation and commit a Published reply carries into *ret (NULL: not wanted); else zeros. */
void td_version_from_reply(const Tensord__Reply *rep, tensord_version *ret);

/*
 * Create + write + publish in one round trip, the bytes inline (len bytes,
 * row-major compact, borrowed for the call). -EMSGSIZE when they do not fit
 * in one request, -EBADMSG from a daemon that knows no Put; in both cases
 * nothing was created.
 */
int td_put_rpc(tensord_client *c, const char *name, const tensord_spec *spec, uint32_t tx,
	       const void *data, size_t len, tensord_version *ret_version);

/*
 * put.c: tensord_put() as a member of transaction tx (0: none, then
 * *ret_version, when not NULL, gets what the publish made). A failure in
 * a transaction leaves the member staged or not; the caller aborts.
 */
int td_put(tensord_client *c, const char *name, const DLTensor *src, uint32_t flags, uint32_t mode,
	   uint32_t tx, tensord_version *ret_version);

/*
 * put.c: td_put() of a device array as a member of transaction tx in a
 * set's GPU allocation (td_tx_create_arena(): arena_size opens it,
 * in_arena goes into it). When *keep is NULL and the member was written,
 * its handle goes to *keep instead of being dropped: the caller holds it,
 * and with it this process's one import of the set, until the set's last
 * member is written, then drops it (its deleter) before the commit.
 */
int td_put_member(tensord_client *c, const char *name, const DLTensor *src, uint32_t flags,
		  uint32_t mode, uint32_t tx, uint64_t arena_size, bool in_arena,
		  DLManagedTensorVersioned **keep);

/*
 * put.c: the end of put_many's writing of a set's GPU allocation, whose
 * first member's handle keep held this process's import (r: 0 when every
 * member was written). A recycled allocation's writable view turns
 * read-only before keep goes. Returns r, or the error of that turn.
 */
int td_put_set_done(DLManagedTensorVersioned *keep, int r);

/*
 * put.c: for tensord_put_many(): checks src as tensord_put() does and
 * fills *spec (a host spec); *ret_nbytes its compact size. 0 or -errno.
 */
int td_put_check(const char *name, const DLTensor *src, uint32_t flags, uint32_t mode,
		 tensord_spec *spec, uint64_t *ret_nbytes);

/* put.c: src's bytes, row-major compact, gathered into buf (room for all of them). */
void td_put_gather(const DLTensor *src, uint8_t *buf);

/* put.c: src's bytes when they already lie row-major compact (nothing to gather), else NULL. */
const uint8_t *td_put_compact(const DLTensor *src);

/*
 * put.c: copies src's nbytes (row-major compact) into base, with the help
 * of the reserve's thread when large. 0, or 1 when some byte of the source
 * cannot be read (nothing copied then).
 */
int td_put_copy(tensord_client *c, const DLTensor *src, uint8_t *base, uint64_t nbytes);

/* put.c: src's bytes written through fd, the memfd of name's new tensor. 0 or -errno, set. */
int td_put_write(int fd, const char *name, const DLTensor *src);

/* An Attach request ready to send, and the mapping it may reuse. */
struct td_attach_req {
	Tensord__Request req;
	Tensord__Attach at;
	uint64_t have_shares[TD_SHARES_MAX];
	struct td_mapping *pinned; /* a reference, or NULL: the caller's */
};

/* requests.c: fills am (name borrowed while it is used). 0 or -errno. */
int td_attach_msg(tensord_client *c, struct td_attach_req *am, const char *name, uint64_t after,
		  int timeout_ms);

/*
 * requests.c: the lease an attach's reply grants. Takes ownership of rep,
 * fd and the reference on pinned, as td_lease_from_reply().
 */
int td_attach_reply(tensord_client *c, const char *name, Tensord__Reply *rep, int fd,
		    struct td_mapping *pinned, struct td_lease **ret_lease);

/* The creator's own view of a tensor, readied for its publish (or commit). */
struct td_own_view {
	struct td_mapping *mine; /* a reference, or NULL: no view of ours */
	const struct td_importer *imp;
};

/* requests.c: readies it (GPU writes waited for, made private unless mutable). 0 or -errno. */
int td_own_view_prepare(tensord_client *c, const char *name, struct td_own_view *v);

/* requests.c: after the publish (published) or its failure; drops the reference. */
void td_own_view_done(tensord_client *c, struct td_own_view *v, bool published);

/* The most bytes a put sends inline (in its request) rather than through a descriptor. */
#define TD_PUT_INLINE_MAX (64u * 1024u)

/*
 * Ends a lease: queues its Release for the flusher or the next request
 * (release.c), or sends it at once when no flusher runs. Never waits for
 * the daemon; any thread; a no-op in effect once the connection is gone.
 */
void td_release(tensord_client *c, uint64_t lease_id);

/* A lease came to c while none was: the flusher, if asleep for good, starts watching (release.c). */
void td_relq_live(tensord_client *c);

/*
 * The flusher's look at an idle client holding leases: if the daemon went
 * (a quiet connection at its end), connects anew, which re-adopts them
 * (lifecycle.c).
 */
void td_client_idle_check(tensord_client *c);

/*
 * Ends a lease on recycled GPU memory (docs/recycle.md, section 4): its
 * Release goes only after dev (this process's numbering) finished every
 * kernel queued so far, which the flusher waits for (never the caller),
 * so that the writer's next version into the same allocation cannot
 * overwrite bytes a queued kernel has yet to read. Without a flusher the
 * caller waits. Any thread.
 */
void td_release_after_sync(tensord_client *c, uint64_t lease_id, DLDevice dev);

/*
 * Whether a lease of m (NULL: none) may need td_release_after_sync(), and
 * on which device: m is a GPU ring buffer's. Then the caller unmaps its
 * mapping and asks td_release_last_of_import(m->revoked, as it was): only
 * a Release after which this process holds no mapping of the allocation
 * waits for the device (docs/recycle.md, section 0, "GPU rings"). One
 * that leaves another mapping of it (another member of its set, another
 * lease of its tensor) goes at once: what holds the allocation meanwhile
 * is this process's, whose last Release waits for every kernel queued
 * before it, this one's included. Same thread for both calls.
 */
bool td_release_needs_sync(const struct td_mapping *m, DLDevice *ret_dev);
bool td_release_last_of_import(bool revoked);

/* Starts the flusher of conn's deferred releases; without one they go at once. */
void td_relq_start(struct td_conn *conn, struct td_mapcache *maps);

/* Stops and joins the flusher; queued releases are dropped (the connection ends them). */
void td_relq_stop(struct td_conn *conn);

/* Sends the queued releases now (tensord_close(), before the socket shuts). */
void td_relq_flush(struct td_conn *conn);

/*
 * Encodes the queued releases as frames ending exactly at end (the room
 * before end holds TD_RELQ_MAX * TD_RELEASE_FRAME_MAX bytes) and empties
 * the queue. send_lock held. Returns the bytes written before end.
 */
size_t td_relq_drain(struct td_relq *q, uint8_t *end);

/*
 * The process forked while this connection held leases: sends, after the
 * releases queued, a Release with forked set, so that the daemon never
 * recycles what a child may still read (docs/recycle.md, "Fork").
 * send_lock held.
 */
void td_relq_forked_locked(struct td_conn *conn);

/* transport.c: closes every descriptor in q. */
void td_fdq_clear(struct td_fdq *q);

/*
 * transport.c: marks the connection dead and wakes every waiter; why (NULL:
 * none) is what calls on it report from now on. The first reason stays.
 * Lock held.
 */
void td_conn_lost(struct td_conn *conn, int err, const char *why);

/* Sends len bytes on conn's socket. send_lock held. 0 or -errno, error set. */
int td_conn_send_locked(struct td_conn *conn, const uint8_t *buf, size_t len);

/* Sends a request that gets no reply (Release). req is borrowed for the call. */
int td_send_oneway(tensord_client *c, Tensord__Request *req);

/*
 * A client with one reference around fd, a connected socket (-1: none
 * yet), with no Hello exchanged and no release flusher: tensord_connect()
 * does both; unit tests use it bare. Takes ownership of fd. NULL: out of
 * memory (fd closed).
 */
tensord_client *td_client_new(int fd);

/* Takes a reference on c; each live lease holds one. */
void td_client_ref(tensord_client *c);

/* Drops one reference on c; the last one closes the socket and frees c. */
void td_client_unref(tensord_client *c);

/* sets.c: an AttachMany request and what it points into. */
struct td_set_req {
	Tensord__Request req;
	Tensord__AttachMany am;
	uint64_t have_shares[TD_SHARES_MAX];
};

/*
 * sets.c: checks names (n of them; NULL: the tensors under prefix) and
 * fills m (names and prefix borrowed while it is used). 0 or -errno, set.
 */
int td_set_msg(tensord_client *c, struct td_set_req *m, const char *const *names, size_t n,
	       const char *prefix, uint64_t after, int timeout_ms);

/* sets.c: ends the leases a failed or abandoned set's parts granted, and clears p. */
void td_set_let_go(tensord_client *c, struct td_pending *p);

/* sets.c: the set p's parts grant, built into *ret_set. Consumes what p holds. 0 or -errno. */
int td_set_build(tensord_client *c, struct td_pending *p, tensord_set **ret_set);

/*
 * fork.c: c joins the clients a fork() keeps whole and the child lets go of
 * (td_client_new(), which registers the fork handlers on first use); and
 * leaves them (the last reference).
 */
void td_fork_track(tensord_client *c);
void td_fork_untrack(tensord_client *c);

#endif /* TENSORD_CLIENT_H */
