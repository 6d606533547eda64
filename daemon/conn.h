/*
 * One client connection: its socket, the framing, the queue of replies and
 * the descriptors they carry, and back-pressure. This is the transport: it
 * knows frames, not what is in them. Whole request frames, framing errors
 * and the close go up through struct conn_handlers, which server.c sets;
 * nothing here calls a layer above by name. Everything runs on the one libuv
 * loop thread.
 */
#ifndef TENSORD_CONN_H
#define TENSORD_CONN_H

#include <sys/queue.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>
#include <uv.h>

#include "daemon/base/ratelimit.h"

/* Replies queued for one client before we stop reading its requests. */
#define CONN_OUT_HIGH (4u << 20)
/* Replies queued for one client past which it is disconnected: only a
 * client that stopped reading while its waiters were answered gets here. */
#define CONN_OUT_MAX (16u << 20)
/* Descriptors one reply frame carries at most (one sendmsg: SCM_MAX_FD is 253). */
#define CONN_FDS_PER_FRAME 240u
/* Refused connections kept open (for their error reply to be read) at once. */
#define CONN_LINGER_MAX 64

struct conn;
struct quota;

/*
 * A descriptor a reply will carry, made only when its frame goes to the
 * socket: a queued reply holds no descriptor of the daemon's. Opaque to
 * conn.c, which hands it back to conn_handlers.export_fd.
 */
struct conn_fd_ticket {
	uint64_t req_id;
	unsigned kind; /* the request's (Tensord__Request body case), for its error count */
	uint64_t lease;
	uint64_t reserve; /* nonzero: the descriptor is this reserve's, not lease's */
	bool page;        /* the descriptor is the connection's binding page */
	bool writable;
	/* The frame names this lease without a descriptor of its own: only
	 * export_failed sees it, to end it with the others of the frame. */
	bool no_fd;
};

/*
 * How a connection reaches the layer above. ctx is conn_set.ctx. c is
 * borrowed in every callback. Once on_close(c) has run, only c->dead may be
 * read, and only until the callback that was running returns: the memory
 * goes when libuv lets go of the poll handle.
 */
struct conn_handlers {
	/* A client connected: set up conn_data(c), which is zeroed. */
	void (*on_open)(struct conn *c, void *ctx);
	/*
	 * One whole request frame. payload is borrowed: valid until on_frame
	 * returns. The callee may send on, shut down or close c.
	 */
	void (*on_frame)(struct conn *c, const uint8_t *payload, size_t len, void *ctx);
	/*
	 * The peer broke the framing: status is -EMSGSIZE, -EPROTO or -ENOMEM
	 * and msg says how. The place to answer it; c then flushes what is
	 * queued and closes.
	 */
	void (*on_protocol_error)(struct conn *c, int status, const char *msg, void *ctx);
	/*
	 * c is closing, for whatever reason: drop everything that refers to it.
	 * The last callback for c; conn_send() refuses from here on.
	 */
	void (*on_close)(struct conn *c, void *ctx);
	/* Everything queued for c was sent, after some had to wait. May be NULL. */
	void (*on_drained)(struct conn *c, void *ctx);
	/*
	 * The descriptor for tk, as its frame is about to be sent: >= 0 (conn.c
	 * closes it once sent), -EMFILE or -ENFILE (tried again later), or
	 * another -errno: the frame is dropped and export_failed answers it.
	 */
	int (*export_fd)(struct conn *c, const struct conn_fd_ticket *tk, void *ctx);
	/*
	 * The reply that carried the n descriptors of tks[] could not be sent
	 * (tks[failed]'s export failed with err): answer its request with err.
	 * Called once per frame; tks is borrowed for the call.
	 */
	void (*export_failed)(struct conn *c, const struct conn_fd_ticket *tks, size_t n,
			      size_t failed, int err, void *ctx);
	/*
	 * Packs a reply frame carrying only status and msg (request id 0) into
	 * buf, for a connection refused before it is served. The frame's
	 * length, or 0 if it does not fit.
	 */
	size_t (*pack_refusal)(uint8_t *buf, size_t cap, int status, const char *msg);
};

/* Every client connection. Embedded in struct server. */
struct conn_set {
	uv_loop_t *loop;
	const struct conn_handlers *handlers; /* borrowed; outlives the set */
	void *ctx;                            /* handed to every handler */
	size_t data_size;                     /* bytes of conn_data() per connection */
	unsigned max;                         /* connections served at once */
	unsigned n;
	uint64_t next_id;
	LIST_HEAD(, conn) list; /* every open connection, newest first */
	/* Per-uid shares of connections and descriptors in flight; borrowed,
	 * NULL: not counted. Set by server.c after conn_set_init(). */
	struct quota *quota;
	unsigned fds_per_conn; /* descriptors queued or in flight per connection */
	/* Connections whose sending waits (descriptors in flight, ETOOMANYREFS,
	 * EMFILE) and refused ones lingering: one timer serves both. */
	uv_timer_t retry;
	unsigned n_blocked;
	unsigned n_linger;
	int linger_fd[CONN_LINGER_MAX];
	uint64_t linger_until[CONN_LINGER_MAX]; /* uv_now() in ms */
	uint64_t fd_waits; /* times a reply waited for descriptors: for stats */
	/* Closed connections whose peer has not received every descriptor we
	 * sent: their sockets stay open (shut down) and their uid stays
	 * charged until the peer reads or closes. Owned. */
	struct conn_drain *drain;
	unsigned n_drain, cap_drain;
	/* Connections that failed (a send, or a shutdown with nothing left to
	 * send) and wait to be closed: closing one runs on_close, which frees
	 * what refers to it (its leases, tensors, watchers), so it is never done
	 * under the caller that saw the failure. reap closes them in the loop's
	 * check phase, outside every callback; reap_idle keeps the loop from
	 * blocking in poll while some wait (a failure seen in a timer). */
	LIST_HEAD(, conn) failed;
	uv_check_t reap;
	uv_idle_t reap_idle;
	bool stopping; /* conn_set_fini() ran: close, never drain */
};

struct conn_drain {
	int fd; /* owned */
	uint32_t uid;
	uint32_t fds_in_flight;
};

struct outbuf {
	struct outbuf *next;
	size_t len, off;
	unsigned n_tk;             /* leases the frame hands over (tickets) */
	unsigned n_fds;            /* of those, descriptors that ride with the first byte */
	struct conn_fd_ticket *tk; /* n_tk of them: &tk1, or owned when more than one */
	struct conn_fd_ticket tk1;
	uint8_t data[];
};

struct conn {
	struct conn_set *set; /* borrowed */
	uint64_t id;
	uint32_t pid, uid, gid; /* the peer, from SO_PEERCRED, never from a message */
	int fd;                 /* owned; closed once poll is closed */
	uv_poll_t poll;
	int poll_events;
	uint8_t *in; /* received, not yet parsed */
	size_t in_len, in_cap;
	struct outbuf *out_head, *out_tail;
	size_t out_bytes;
	uint32_t fds_queued;        /* queued replies that will carry a descriptor */
	uint32_t fds_in_flight;     /* sent since the peer last had nothing unread */
	bool blocked;               /* sending waits for the retry timer */
	bool drain;                 /* at close: descriptors in flight; keep the socket */
	bool flushing;              /* in conn_flush(): conn_send() only queues */
	bool backlog;               /* replies waited in the queue since the last on_drained */
	bool closing;               /* flush what is queued, then close */
	bool failed;                /* sends and reads nothing more; closed soon (set->failed) */
	bool dead;                  /* closed; waiting for libuv to let go */
	struct log_limits limits;   /* of the lines this peer can cause (ratelimit.h) */
	LIST_ENTRY(conn) link;      /* the set's connections, newest first */
	LIST_ENTRY(conn) fail_link; /* set->failed, while failed */
	max_align_t data[];         /* set->data_size bytes, the layer above's */
};

void conn_set_init(struct conn_set *set, uv_loop_t *loop, const struct conn_handlers *handlers,
		   void *ctx, size_t data_size, unsigned max);

/* Serves an accepted socket. Takes ownership of fd: it is closed on every path. */
void conn_accept(struct conn_set *set, int fd);

/* The layer above's state: set->data_size bytes, zeroed at accept. Borrowed: lives as long as c. */
static inline void *conn_data(struct conn *c)
{
	return c->data;
}

/*
 * Whether c is past serving: closed, or failed and about to be. Nothing
 * sent to it arrives; its memory and conn_data() are still valid.
 */
static inline bool conn_gone(const struct conn *c)
{
	return c->dead || c->failed;
}

/*
 * Packs msg into one frame and queues it, sending at once what the socket
 * takes. tk (copied; NULL when none) names the descriptor that goes with
 * it, made when it is sent. 0; -ENOTCONN when c is gone (conn_gone());
 * -EMSGSIZE when the frame would pass TD_FRAME_MAX_REPLY (nothing queued, c
 * stays open); -ENOBUFS when c has CONN_OUT_MAX bytes unread, -ENOMEM or a
 * send error, and c has failed: it is closed later (conn_fail()), never
 * under the caller, so whatever the caller holds stays valid.
 */
int conn_send(struct conn *c, const ProtobufCMessage *msg, const struct conn_fd_ticket *tk);

/*
 * As conn_send(), with the n descriptors (at most CONN_FDS_PER_FRAME) the
 * tickets tks[] name (copied) riding with the one frame.
 */
int conn_send_fds(struct conn *c, const ProtobufCMessage *msg, const struct conn_fd_ticket *tks,
		  size_t n);

/* Stops the retry timer and closes lingering refused connections (shutdown). */
void conn_set_fini(struct conn_set *set);

/* Who c is, for rate-limited log lines. */
static inline struct log_peer conn_peer(const struct conn *c)
{
	return (struct log_peer){ .conn_id = c->id, .pid = c->pid, .uid = c->uid };
}

/* A log line about c that c can cause at will, rate-limited (ratelimit.h). */
#define conn_log_limited(c, level, kind, ...)                                                      \
	do {                                                                                       \
		struct log_peer peer_ = conn_peer(c);                                              \
		log_limited((level), (kind), &(c)->limits, &peer_, __VA_ARGS__);                   \
	} while (0)

/*
 * A pidfd of the process that connected c (SO_PEERPIDFD, Linux 6.5: the
 * very process, never one that reused its pid), the caller's to close; or
 * -errno: -ENOPROTOOPT on older kernels, -ESRCH or -EINVAL when that
 * process is gone. Valid until on_close(c) returns.
 */
int conn_peer_pidfd(const struct conn *c);

/* Flushes what is queued, then closes; never within the call (conn_fail()). */
void conn_shutdown(struct conn *c);

/*
 * c failed: it sends and reads nothing more, and is closed (on_close) from
 * the loop's check phase, after the callback that is running returns. Safe
 * to call from anywhere on the loop thread, any number of times; a no-op
 * once c is closed.
 */
void conn_fail(struct conn *c);

/*
 * Closes at once: drops queued replies, then calls on_close. The memory goes
 * once libuv lets go of the poll handle. Only for the connection's own
 * callbacks at the top of the loop (its poll, the retry timer, the reaper,
 * shutdown): a layer above that holds state c's close frees calls
 * conn_fail() or conn_shutdown() instead.
 */
void conn_close(struct conn *c);

/* Closes every connection in the set. */
void conn_close_all(struct conn_set *set);

#endif
