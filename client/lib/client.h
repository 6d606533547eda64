/*
 * Internals of libtensord shared by its files. A tensord_client is a
 * connection (struct td_conn, client.c) and the cache of mappings its
 * leases use (struct td_mapcache, mapcache.c), under one lock. Leases and
 * their DLPack handles are in lease.c, the requests in requests.c.
 */
#ifndef TENSORD_CLIENT_H
#define TENSORD_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <tensord/tensord.h>

#include "import.h"
#include "lease.h"
#include "mapcache.h"
#include "proto/tensord.pb-c.h"

/* Descriptors one connection may hold unclaimed; see struct td_fdq. */
#define TD_FDQ 8

/* A request waiting for its reply; lives on the stack of td_rpc(). */
struct td_pending {
	uint64_t id;
	bool done;
	Tensord__Reply *reply; /* owned once done; NULL if the connection died */
	int fd;                /* owned once done; -1 when none */
	struct td_pending *next;
};

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
	struct td_pending *pending; /* borrowed: each lives on its td_rpc() caller's stack */
	struct td_rbuf rx;
	struct td_fdq fdq;
	struct td_relq relq; /* guarded by send_lock, not by the client's lock */
};

struct tensord_client {
	atomic_uint refs;     /* the user's handle plus one per live lease */
	pthread_mutex_t lock; /* guards conn (but its fd and send_lock), maps, successor */
	struct td_conn conn;
	struct td_mapcache maps;
	/*
	 * Fork (docs/design.md, "Fork"). inherited is set in a forked child,
	 * before any other thread exists there, and never cleared: the client
	 * then only serves the leases it had, and requests go to successor,
	 * the child's own connection to path, made on first use.
	 */
	char path[108]; /* the socket it connected to */
	bool inherited;
	bool user_closed;                    /* tensord_close() ran on an inherited client */
	tensord_client *successor;           /* owned (the user's handle of it); NULL: none yet */
	LIST_ENTRY(tensord_client) all_link; /* every live client of this process (client.c) */
};

/*
 * The client that serves requests made on c in this process: c itself,
 * or, when c was inherited across fork(), the process's own connection to
 * the same daemon, connected on first use (*pc is replaced). 0 or -errno
 * with the error set (the new connection failed, or c was closed). Every
 * public call that takes a client starts with it.
 */
int td_client_current(tensord_client **pc);

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
 * The Create round trip of tensord_create(), without mapping anything: on
 * success *ret_reply is a Lease reply (with its tensor), owned by the
 * caller (tensord__reply__free_unpacked), and so is *ret_fd (-1 when
 * none). The lease it grants is the caller's to end (td_lease_end).
 */
int td_create_rpc(tensord_client *c, const char *name, const tensord_spec *spec,
		  Tensord__Reply **ret_reply, int *ret_fd);

/*
 * Create + write + publish in one round trip, the bytes inline (len bytes,
 * row-major compact, borrowed for the call). -EMSGSIZE when they do not fit
 * in one request, -EBADMSG from a daemon that knows no Put; in both cases
 * nothing was created.
 */
int td_put_rpc(tensord_client *c, const char *name, const tensord_spec *spec, const void *data,
	       size_t len);

/*
 * Ends a lease: queues its Release for the flusher or the next request
 * (release.c), or sends it at once when no flusher runs. Never waits for
 * the daemon; any thread; a no-op in effect once the connection is gone.
 */
void td_release(tensord_client *c, uint64_t lease_id);

/* Starts the flusher of conn's deferred releases; without one they go at once. */
void td_relq_start(struct td_conn *conn, struct td_mapcache *maps);

/* Stops and joins the flusher; queued releases are dropped (the connection ends them). */
void td_relq_stop(struct td_conn *conn);

/*
 * Encodes the queued releases as frames ending exactly at end (the room
 * before end holds TD_RELQ_MAX * TD_RELEASE_FRAME_MAX bytes) and empties
 * the queue. send_lock held. Returns the bytes written before end.
 */
size_t td_relq_drain(struct td_relq *q, uint8_t *end);

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

#endif /* TENSORD_CLIENT_H */
