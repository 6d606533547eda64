/*
 * libtensord: the connection. Requests go out under send_lock; replies are
 * read by whichever waiting thread gets there first (the "reader"), which
 * hands each reply to the thread waiting for its id. So several threads
 * can have requests in flight, and an attach that waits for a publish does
 * not block other threads' calls.
 */
#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "common/sys.h"
#include "common/desc.h"
#include "proto/frame.h"

/* Every live client of this process, for fork() (docs/design.md, "Fork"). */
static pthread_mutex_t all_lock = PTHREAD_MUTEX_INITIALIZER;
static LIST_HEAD(, tensord_client) all_clients = LIST_HEAD_INITIALIZER(all_clients);
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

void td_client_ref(tensord_client *c)
{
	atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
}

/* Frees what conn owns; it may be half-built (fd -1, nothing received). */
static void conn_free(struct td_conn *conn)
{
	for (int i = 0; i < conn->fdq.n; i++)
		close(conn->fdq.q[i].fd);
	if (conn->fd >= 0)
		close(conn->fd);
	free(conn->rx.buf);
	pthread_mutex_destroy(&conn->send_lock);
	pthread_cond_destroy(&conn->cond);
}

void td_client_unref(tensord_client *c)
{
	unsigned was = atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel);

	assert(was > 0);
	if (was != 1)
		return;
	pthread_mutex_lock(&all_lock);
	LIST_REMOVE(c, all_link);
	pthread_mutex_unlock(&all_lock);
	/* An inherited client's last lease went after its close. */
	if (c->successor)
		tensord_close(c->successor);
	/* Last reference: no thread is inside a call, no lease is alive, so
	 * the mapping cache holds only parked mappings. */
	td_relq_stop(&c->conn);
	conn_free(&c->conn);
	td_mapcache_fini(&c->maps);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* Marks the connection dead and wakes every waiter. Lock held. */
static void conn_lost(struct td_conn *conn, int err)
{
	if (!conn->closed) {
		conn->closed = true;
		conn->err = err;
	}
	pthread_cond_broadcast(&conn->cond);
}

/* Sends one frame holding req, borrowed for the call. */
int td_conn_send_locked(struct td_conn *conn, const uint8_t *buf, size_t len)
{
	size_t off = 0;

	while (off < len) {
		ssize_t n = send(conn->fd, buf + off, len - off, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return td_set_error(-errno == -EPIPE ? -ECONNRESET : -errno,
					    "connection to tensord lost: %s", strerror(errno));
		}
		off += (size_t)n;
	}
	return 0;
}

/* Room in front of a request for the releases queued before it. */
#define REL_ROOM (TD_RELQ_MAX * TD_RELEASE_FRAME_MAX)

/*
 * Sends req, with the releases deleters queued meanwhile in front of it in
 * the same send(): one wake-up of the daemon for both.
 */
static int send_frame(struct td_conn *conn, Tensord__Request *req)
{
	uint8_t stack[REL_ROOM + 1024], *buf = stack;
	size_t plen = tensord__request__get_packed_size(req), len, rel;
	int r;

	if (plen > TD_FRAME_MAX_REQUEST)
		return td_set_error(-EMSGSIZE, "request of %zu bytes is too large", plen);
	len = TD_FRAME_HEADER + plen;
	if (REL_ROOM + len > sizeof(stack)) {
		buf = malloc(REL_ROOM + len);
		if (!buf)
			return td_set_error(-ENOMEM, "out of memory");
	}
	td_frame_header(buf + REL_ROOM, (uint32_t)plen, 0);
	tensord__request__pack(req, buf + REL_ROOM + TD_FRAME_HEADER);
	pthread_mutex_lock(&conn->send_lock);
	rel = td_relq_drain(&conn->relq, buf + REL_ROOM);
	r = td_conn_send_locked(conn, buf + REL_ROOM - rel, rel + len);
	pthread_mutex_unlock(&conn->send_lock);
	if (buf != stack)
		free(buf);
	return r;
}

/*
 * Queues fd, which came with the stream bytes [start, end).
 * Takes ownership of fd: it is queued, or closed when the queue is full.
 */
static int fdq_push(struct td_fdq *q, int fd, uint64_t start, uint64_t end)
{
	if (q->n == TD_FDQ) {
		close(fd);
		return td_set_error(-EPROTO, "tensord sent too many descriptors");
	}
	q->q[q->n].start = start;
	q->q[q->n].end = end;
	q->q[q->n].fd = fd;
	q->n++;
	return 0;
}

/*
 * Takes the descriptor that came with the frame starting at stream offset
 * pos, and closes strays before it. Returns it owned by the caller, or -1.
 */
static int fdq_take(struct td_fdq *q, uint64_t pos)
{
	int fd = -1, j = 0;

	for (int i = 0; i < q->n; i++) {
		if (fd < 0 && q->q[i].start <= pos && pos < q->q[i].end) {
			fd = q->q[i].fd;
		} else if (q->q[i].end <= pos) {
			close(q->q[i].fd); /* stray: no frame claimed it */
		} else {
			q->q[j++] = q->q[i];
		}
	}
	q->n = j;
	return fd;
}

/*
 * Hands rep to the thread waiting for its id, or drops it. Takes ownership
 * of rep and of fd (-1 when none): moved to the waiter, or freed and
 * closed. Returns the status of an id 0 error, else 0. Lock held.
 */
static int hand_over(struct td_conn *conn, Tensord__Reply *rep, int fd)
{
	struct td_pending *p;
	int st = 0;

	for (p = conn->pending; p; p = p->next)
		if (p->id == rep->id && !p->done)
			break;
	if (p) {
		p->done = true;
		p->reply = rep;
		p->fd = fd;
		return 0;
	}
	/* An id 0 error is the daemon closing us for a protocol error. */
	if (rep->id == 0 && rep->status < 0) {
		td_set_error(rep->status, "%s", rep->message);
		snprintf(conn->why, sizeof(conn->why), "%s", rep->message);
		st = rep->status;
	}
	tensord__reply__free_unpacked(rep, NULL);
	if (fd >= 0)
		close(fd);
	return st;
}

/* Delivers every complete frame in the receive buffer. Lock held. */
static int deliver_frames(struct td_conn *conn)
{
	struct td_rbuf *rx = &conn->rx;
	size_t off = 0;

	for (;;) {
		struct td_frame f;
		long n = td_frame_parse(rx->buf + off, rx->len - off, TD_FRAME_MAX_REPLY, &f);
		Tensord__Reply *rep;
		int fd = -1, st;

		if (n == 0)
			break;
		if (n < 0)
			return td_set_error((int)n, "tensord sent a bad frame: %s",
					    tensord_strerror((int)n));
		if (f.flags & TD_FRAME_FLAG_FD) {
			fd = fdq_take(&conn->fdq, rx->pos + off);
			if (fd < 0)
				return td_set_error(-EPROTO,
						    "tensord sent a frame without its descriptor");
		}
		rep = tensord__reply__unpack(NULL, f.len, f.payload);
		off += (size_t)n;
		if (!rep) {
			if (fd >= 0)
				close(fd);
			return td_set_error(-EBADMSG, "tensord sent a malformed reply");
		}
		st = hand_over(conn, rep, fd);
		if (st < 0)
			return st;
	}
	if (off) {
		memmove(rx->buf, rx->buf + off, rx->len - off);
		rx->len -= off;
		rx->pos += off;
	}
	return 0;
}

/*
 * The reader polls the socket for a reply before it sleeps in recvmsg(): a
 * reply to most requests comes within a few tens of microseconds, while
 * waking a sleeping thread on another CPU costs about as much again on a
 * VM. How long: td_spin_budget_us() (common/sys.c).
 */
static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* recvmsg() without sleeping for up to the spin budget; -1 with EAGAIN when nothing came. */
static ssize_t spin_recv(int fd, struct msghdr *m)
{
	unsigned us = td_spin_budget_us();
	uint64_t end;
	ssize_t n;

	if (us == 0) {
		errno = EAGAIN;
		return -1;
	}
	end = mono_ns() + (uint64_t)us * 1000;
	do {
		n = recvmsg(fd, m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		if (n >= 0 || (errno != EAGAIN && errno != EINTR))
			return n;
	} while (mono_ns() < end);
	return n;
}

/*
 * One recvmsg into the receive buffer, without the lock (we are the
 * reader). On success *ret_n bytes came, and *ret_fd is the first
 * descriptor with them, owned by the caller, or -1.
 */
static int read_some(struct td_conn *conn, int *ret_fd, size_t *ret_n)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 4)];
		struct cmsghdr align;
	} u;
	struct td_rbuf *rx = &conn->rx;
	struct iovec iov;
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (rx->cap - rx->len < 4096) {
		size_t cap = rx->cap ? rx->cap * 2 : 16384;
		uint8_t *nb;

		if (cap > TD_FRAME_MAX_REPLY + 2 * TD_FRAME_HEADER + 16384)
			return td_set_error(-EMSGSIZE, "tensord sent an oversized reply");
		nb = realloc(rx->buf, cap);
		if (!nb)
			return td_set_error(-ENOMEM, "out of memory");
		rx->buf = nb;
		rx->cap = cap;
	}
	iov.iov_base = rx->buf + rx->len;
	iov.iov_len = rx->cap - rx->len;
	m.msg_control = u.buf;
	m.msg_controllen = sizeof(u.buf);
	*ret_fd = -1;
	n = spin_recv(conn->fd, &m);
	while (n < 0 && (errno == EINTR || errno == EAGAIN))
		n = recvmsg(conn->fd, &m, MSG_CMSG_CLOEXEC);
	if (n < 0)
		return td_set_error(-ECONNRESET, "connection to tensord lost: %s", strerror(errno));
	if (n == 0)
		return td_set_error(-ECONNRESET,
				    "connection to tensord lost: the daemon closed it");
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);

		for (size_t i = 0; i < nfd; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (*ret_fd < 0)
				*ret_fd = fd;
			else
				close(fd); /* the daemon sends one per frame */
		}
	}
	*ret_n = (size_t)n;
	return 0;
}

/* Waits for p to be answered, reading for everyone when nobody else is. Lock held. */
static int wait_reply(tensord_client *c, struct td_pending *p)
{
	struct td_conn *conn = &c->conn;

	while (!p->done && !conn->closed) {
		if (conn->reading) {
			pthread_cond_wait(&conn->cond, &c->lock);
			continue;
		}
		conn->reading = true;
		pthread_mutex_unlock(&c->lock);
		int fd = -1, r;
		size_t n = 0;

		r = read_some(conn, &fd, &n);
		pthread_mutex_lock(&c->lock);
		conn->reading = false;
		if (r == 0) {
			uint64_t start = conn->rx.pos + conn->rx.len;

			if (fd >= 0)
				r = fdq_push(&conn->fdq, fd, start, start + n);
			conn->rx.len += n;
			if (r == 0)
				r = deliver_frames(conn);
		}
		if (r < 0)
			conn_lost(conn, r);
		pthread_cond_broadcast(&conn->cond);
	}
	if (!p->done)
		return conn->err ? conn->err : -ENOTCONN;
	return 0;
}

int td_rpc(tensord_client *c, Tensord__Request *req, Tensord__Reply **ret_reply, int *ret_fd)
{
	struct td_pending p = { .fd = -1 };
	int r;

	/* Requests that make no lease may be sent from any client handle;
	 * those that do chose their client before (td_client_current()). */
	r = td_client_current(&c);
	if (r < 0)
		return r;
	pthread_mutex_lock(&c->lock);
	if (c->conn.closed) {
		r = c->conn.err ? c->conn.err : -ENOTCONN;
		pthread_mutex_unlock(&c->lock);
		return td_set_error(r, "client is closed: %s", tensord_strerror(r));
	}
	p.id = ++c->conn.next_id;
	p.next = c->conn.pending;
	c->conn.pending = &p;
	pthread_mutex_unlock(&c->lock);

	req->id = p.id;
	r = send_frame(&c->conn, req);

	pthread_mutex_lock(&c->lock);
	if (r < 0)
		conn_lost(&c->conn, r);
	else
		r = wait_reply(c, &p);
	for (struct td_pending **pp = &c->conn.pending; *pp; pp = &(*pp)->next) {
		if (*pp == &p) {
			*pp = p.next;
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);

	if (r < 0) {
		if (p.reply)
			tensord__reply__free_unpacked(p.reply, NULL);
		if (p.fd >= 0)
			close(p.fd);
		/* The reader that saw the failure may have been another thread. */
		if (c->conn.why[0])
			return td_set_error(r, "tensord closed the connection: %s", c->conn.why);
		return td_set_error(r, "connection to tensord lost: %s", tensord_strerror(r));
	}
	if (p.reply->status < 0) {
		r = p.reply->status;
		td_set_error(r, "%s", p.reply->message[0] ? p.reply->message : tensord_strerror(r));
		tensord__reply__free_unpacked(p.reply, NULL);
		if (p.fd >= 0)
			close(p.fd);
		return r;
	}
	*ret_reply = p.reply;
	if (ret_fd)
		*ret_fd = p.fd;
	else if (p.fd >= 0)
		close(p.fd);
	return 0;
}

int td_send_oneway(tensord_client *c, Tensord__Request *req)
{
	bool closed;

	pthread_mutex_lock(&c->lock);
	closed = c->conn.closed;
	pthread_mutex_unlock(&c->lock);
	/* After a close the daemon has ended every lease already. */
	if (closed)
		return 0;
	req->id = 0;
	return send_frame(&c->conn, req);
}

/*
 * fork(). Before it, the forking thread takes the list's lock, then each
 * client's lock and send lock (in that order, as everywhere), so that the
 * child copies every client whole; the parent then lets go.
 */
static void atfork_prepare(void)
{
	tensord_client *c;

	pthread_mutex_lock(&all_lock);
	LIST_FOREACH(c, &all_clients, all_link)
	{
		pthread_mutex_lock(&c->lock);
		pthread_mutex_lock(&c->conn.send_lock);
	}
}

static void atfork_parent(void)
{
	tensord_client *c;

	LIST_FOREACH(c, &all_clients, all_link)
	{
		pthread_mutex_unlock(&c->conn.send_lock);
		pthread_mutex_unlock(&c->lock);
	}
	pthread_mutex_unlock(&all_lock);
}

/*
 * In the child, c is a copy of its parent's client: it keeps only what its
 * leases need (the mappings) and lets go of everything else without a word
 * to the daemon. Only this thread exists here, so nothing is contended.
 */
static void forget_parent(tensord_client *c)
{
	struct td_conn *conn = &c->conn;

	/* atfork_prepare() took both locks in the thread this child is a copy
	 * of; the condition variable's waiters were other threads of the
	 * parent, which the child does not have. */
	pthread_mutex_unlock(&conn->send_lock);
	pthread_mutex_unlock(&c->lock);
	pthread_cond_init(&conn->cond, NULL);
	c->inherited = true;
	/* The daemon must see the connection end when the parent ends it. */
	if (conn->fd >= 0)
		close(conn->fd);
	conn->fd = -1;
	for (int i = 0; i < conn->fdq.n; i++)
		close(conn->fdq.q[i].fd);
	conn->fdq.n = 0;
	conn->closed = true;
	conn->err = -ENOTCONN;
	snprintf(conn->why, sizeof(conn->why),
		 "the connection belongs to the process this one "
		 "was forked from");
	conn->pending = NULL; /* they live on the stacks of the parent's threads */
	conn->reading = false;
	/* The parent's releases, and a flusher that was not copied. */
	conn->relq.n = 0;
	conn->relq.running = false;
	td_mapcache_after_fork(&c->maps);
}

static void atfork_child(void)
{
	tensord_client *c;

	if (td_gpu_in_use())
		td_gpu_forked_from = (int)getppid();
	LIST_FOREACH(c, &all_clients, all_link)
	forget_parent(c);
	pthread_mutex_unlock(&all_lock);
}

static void atfork_register(void)
{
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

tensord_client *td_client_new(int fd)
{
	tensord_client *c = calloc(1, sizeof(*c));

	if (!c) {
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	atomic_init(&c->refs, 1);
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->conn.send_lock, NULL);
	pthread_cond_init(&c->conn.cond, NULL);
	td_mapcache_init(&c->maps, &c->lock);
	c->conn.fd = fd;
	pthread_once(&atfork_once, atfork_register);
	pthread_mutex_lock(&all_lock);
	LIST_INSERT_HEAD(&all_clients, c, all_link);
	pthread_mutex_unlock(&all_lock);
	return c;
}

int td_client_current(tensord_client **pc)
{
	tensord_client *c = *pc, *mine;
	int r;

	while (c->inherited) {
		bool closed;

		pthread_mutex_lock(&c->lock);
		closed = c->user_closed;
		mine = c->successor;
		pthread_mutex_unlock(&c->lock);
		if (closed)
			return td_set_error(-ENOTCONN, "client is closed");
		if (!mine) {
			/* Not under c's lock: connecting takes the list's lock,
			 * which a fork takes before c's. */
			r = tensord_connect(c->path, &mine);
			if (r < 0)
				return td_set_error(r,
						    "this process (pid %d) was forked from the one "
						    "that connected, and connecting anew to %s "
						    "failed: %s",
						    (int)getpid(), c->path, tensord_last_error());
			pthread_mutex_lock(&c->lock);
			if (c->successor || c->user_closed) {
				/* Another thread was quicker, or closed it. */
				pthread_mutex_unlock(&c->lock);
				tensord_close(mine);
				continue;
			}
			c->successor = mine;
			pthread_mutex_unlock(&c->lock);
		}
		c = mine;
	}
	*pc = c;
	return 0;
}

/* The Hello round trip: both sides speak the same protocol version. */
static int hello(tensord_client *c, const char *path)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Hello hello = TENSORD__HELLO__INIT;
	Tensord__Reply *rep;
	int r;

	hello.version = TENSORD_PROTOCOL_VERSION;
	hello.client = "libtensord";
	req.body_case = TENSORD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	r = td_rpc(c, &req, &rep, NULL);
	if (r < 0)
		return r;
	if (rep->body_case != TENSORD__REPLY__BODY_HELLO ||
	    rep->hello->version != TENSORD_PROTOCOL_VERSION)
		r = td_set_error(-EPROTO, "tensord at %s speaks another protocol version", path);
	tensord__reply__free_unpacked(rep, NULL);
	return r;
}

int tensord_connect(const char *socket_path, tensord_client **ret_client)
{
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	tensord_client *c;
	int r;

	td_clear_error();
	c = td_client_new(-1);
	if (!c)
		return td_set_error(-ENOMEM, "out of memory");
	r = td_connect_socket(socket_path, path, sizeof(path));
	if (r >= 0) {
		c->conn.fd = r;
		_Static_assert(sizeof(c->path) == sizeof(path), "socket path size");
		memcpy(c->path, path, sizeof(path));
		r = hello(c, path);
	}
	if (r < 0) {
		td_client_unref(c);
		return r;
	}
	td_relq_start(&c->conn, &c->maps);
	*ret_client = c;
	return 0;
}

tensord_client *tensord_close(tensord_client *c)
{
	tensord_client *mine;

	if (!c)
		return NULL;
	if (c->inherited) {
		/* Never the parent's connection: only this process's own. */
		pthread_mutex_lock(&c->lock);
		mine = c->successor;
		c->successor = NULL;
		c->user_closed = true;
		pthread_mutex_unlock(&c->lock);
		tensord_close(mine);
		td_client_unref(c);
		return NULL;
	}
	/*
	 * The daemon frees what this connection leased once it sees EOF. For
	 * memory it exports itself (legacy CUDA IPC, HIP IPC) that is undefined
	 * behaviour while we still have it open, so close those handles first;
	 * leases still alive then point at unmapped memory (docs/gpu.md).
	 */
	td_mapcache_revoke(&c->maps);
	pthread_mutex_lock(&c->lock);
	conn_lost(&c->conn, -ENOTCONN);
	/* Wakes a reader blocked in recvmsg; the daemon sees EOF and ends
	 * every lease of this connection. */
	shutdown(c->conn.fd, SHUT_RDWR);
	pthread_mutex_unlock(&c->lock);
	td_client_unref(c);
	return NULL;
}
