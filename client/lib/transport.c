/*
 * libtensord: the transport, a connection's frames and descriptors.
 * Requests go out under send_lock; replies are read by whichever waiting
 * thread gets there first (the "reader"), which hands each reply to the
 * thread waiting for its id. So several threads can have requests in
 * flight, and an attach that waits for a publish does not block other
 * threads' calls. A client's life (connect, close) is lifecycle.c's, fork()
 * is fork.c's.
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "common/sys.h"
#include "proto/frame.h"

void td_fdq_clear(struct td_fdq *q)
{
	for (int i = 0; i < q->n; i++)
		close(q->fd[i]);
	q->n = 0;
}

void td_conn_lost(struct td_conn *conn, int err, const char *why)
{
	if (!conn->closed) {
		conn->closed = true;
		conn->err = err;
		if (why)
			snprintf(conn->why, sizeof(conn->why), "%s", why);
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

	if (plen > conn->max_request)
		return td_set_error(-EMSGSIZE,
				    "request of %zu bytes is larger than tensord takes (%u bytes)",
				    plen, conn->max_request);
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
 * Moves the descriptors in got, in their order, behind those in q. Takes
 * ownership of them: queued, or closed with q's on -EPROTO.
 */
static int fdq_append(struct td_fdq *q, struct td_fdq *got)
{
	if (q->n + got->n > (int)TD_FDQ) {
		td_fdq_clear(got);
		td_fdq_clear(q);
		return td_set_error(-EPROTO, "tensord sent more descriptors than its frames count");
	}
	memcpy(q->fd + q->n, got->fd, sizeof(int) * (size_t)got->n);
	q->n += got->n;
	got->n = 0;
	return 0;
}

/* The oldest descriptor in q, which must hold one; the caller owns it. */
static int fdq_take(struct td_fdq *q)
{
	int fd = q->fd[0];

	assert(q->n > 0);
	q->n--;
	memmove(q->fd, q->fd + 1, sizeof(int) * (size_t)q->n);
	return fd;
}

static void close_fds(int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
}

/* p is answered: counted for tensord_poll() when an operation waits on it. Lock held. */
static void pending_done(struct td_conn *conn, struct td_pending *p)
{
	p->done = true;
	if (p->async)
		conn->completed++;
}

/*
 * Hands rep to the request waiting for its id (a watch's events to the
 * watch), or drops it. Takes ownership of rep and of the n descriptors
 * fds[] (an array of the caller's): moved to the waiter, or freed and
 * closed. Returns the status of an id 0 error, -EPROTO for descriptors a
 * reply of its kind cannot have, else 0. Lock held.
 */
static int hand_over(struct td_conn *conn, Tensord__Reply *rep, int *fds, unsigned n)
{
	struct td_pending *p;
	int st = 0;

	for (p = conn->pending; p; p = p->next)
		if (p->id == rep->id && !p->done)
			break;
	if (p && p->multi && rep->status == 0 &&
	    rep->body_case == TENSORD__REPLY__BODY_ATTACH_MANY) {
		struct td_part *part = calloc(1, sizeof(*part));
		int *own = n ? malloc(n * sizeof(int)) : NULL;

		if (!part || (n && !own)) {
			free(part);
			free(own);
			close_fds(fds, n);
			tensord__reply__free_unpacked(rep, NULL);
			return td_set_error(-ENOMEM, "out of memory for a reply");
		}
		if (n)
			memcpy(own, fds, n * sizeof(int));
		*part = (struct td_part){ .reply = rep, .fds = own, .n_fds = n };
		if (!p->tail)
			p->tail = &p->parts;
		*p->tail = part;
		p->tail = &part->next;
		if (!rep->attach_many->more)
			pending_done(conn, p);
		return 0;
	}
	if (n > 1) {
		close_fds(fds, n);
		tensord__reply__free_unpacked(rep, NULL);
		return td_set_error(-EPROTO,
				    "tensord sent %u descriptors with a reply that carries "
				    "one",
				    n);
	}
	if (p) {
		p->reply = rep;
		p->fd = n ? fds[0] : -1;
		pending_done(conn, p);
		return 0;
	}
	if (rep->id && n == 0 && td_watch_deliver(conn, rep)) {
		tensord__reply__free_unpacked(rep, NULL);
		return 0;
	}
	/* An id 0 error is the daemon closing us for a protocol error. */
	if (rep->id == 0 && rep->status < 0)
		st = td_set_error(rep->status, "tensord closed the connection: %s", rep->message);
	tensord__reply__free_unpacked(rep, NULL);
	close_fds(fds, n);
	return st;
}

/* Parses the frame at buf; a bad header is the connection's end. */
static long parse_reply(const uint8_t *buf, size_t len, struct td_frame *f)
{
	long n = td_frame_parse(buf, len, TD_FRAME_MAX_REPLY, TD_FRAME_MAX_FDS_REPLY, f);

	if (n == -ETOOMANYREFS)
		return td_set_error(-EPROTO,
				    "tensord sent a frame that counts more descriptors than the %u "
				    "a reply carries",
				    TD_FRAME_MAX_FDS_REPLY);
	if (n < 0)
		return td_set_error((int)n, "tensord sent a bad frame: %s",
				    tensord_strerror((int)n));
	return n;
}

/*
 * Checks, before any frame is handed over, that the descriptors queued are
 * exactly those the received frames count. They ride with their frame's
 * first byte, so every frame begun in the buffer has its own here; a frame
 * whose header is not all there yet may have up to the most a reply
 * carries. Then each frame finds its own at the head of the queue.
 */
static int check_counts(const struct td_rbuf *rx, const struct td_fdq *q)
{
	unsigned want = 0, slack = 0;
	size_t off = 0;

	for (;;) {
		struct td_frame f;
		long n = parse_reply(rx->buf + off, rx->len - off, &f);

		if (n < 0)
			return (int)n;
		want += f.n_fds; /* the arriving frame's too, once its header is here */
		if (n == 0)
			break;
		off += (size_t)n;
	}
	if (rx->len - off > 0 && rx->len - off < TD_FRAME_HEADER)
		slack = TD_FRAME_MAX_FDS_REPLY;
	if ((unsigned)q->n < want || (unsigned)q->n > want + slack)
		return td_set_error(-EPROTO,
				    "tensord sent %d descriptor%s with frames that count %u", q->n,
				    q->n == 1 ? "" : "s", want);
	return 0;
}

/*
 * Delivers every complete frame in the receive buffer, each with the
 * descriptors its header counts, taken from the head of conn->fdq. Lock
 * held. On an error the caller closes every descriptor still queued.
 */
static int deliver_frames(struct td_conn *conn)
{
	struct td_rbuf *rx = &conn->rx;
	size_t off = 0;
	int r;

	r = check_counts(rx, &conn->fdq);
	if (r < 0)
		return r;
	for (;;) {
		struct td_frame f;
		long n = parse_reply(rx->buf + off, rx->len - off, &f);
		int fds[TD_FRAME_MAX_FDS_REPLY];
		Tensord__Reply *rep;

		/* 0: the rest is still arriving (errors: check_counts() saw them). */
		if (n <= 0)
			break;
		for (unsigned i = 0; i < f.n_fds; i++)
			fds[i] = fdq_take(&conn->fdq);
		rep = tensord__reply__unpack(NULL, f.len, f.payload);
		off += (size_t)n;
		if (!rep) {
			close_fds(fds, f.n_fds);
			return td_set_error(-EBADMSG, "tensord sent a malformed reply");
		}
		r = hand_over(conn, rep, fds, f.n_fds);
		if (r < 0)
			return r;
	}
	if (off) {
		memmove(rx->buf, rx->buf + off, rx->len - off);
		rx->len -= off;
	}
	return 0;
}

/*
 * The reader polls the socket for a reply before it sleeps (read_some()): a
 * reply to most requests comes within a few tens of microseconds, while
 * waking a sleeping thread on another CPU costs about as much again on a
 * VM. Whether and how long: the connection's td_spin (common/sys.h),
 * which stops polling while this thread is confined to one CPU or while
 * polls keep missing. Only the reader touches it.
 */
static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/*
 * recvmsg() without sleeping for up to the spin budget; -1 with EAGAIN when
 * nothing came. Stops early, and backs off, when a gap between two looks
 * at the clock shows that this thread lost its CPU meanwhile.
 */
static ssize_t spin_recv(struct td_conn *conn, struct msghdr *m)
{
	uint64_t now = mono_ns(), end;
	unsigned us = td_spin_budget_us(&conn->spin, now);
	enum td_spin_outcome how;
	ssize_t n;

	if (us == 0) {
		errno = EAGAIN;
		return -1;
	}
	end = now + (uint64_t)us * 1000;
	/* A reply already there on the first look is no poll's merit. */
	n = recvmsg(conn->fd, m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n >= 0 || (errno != EAGAIN && errno != EINTR))
		return n;
	for (;;) {
		uint64_t t = mono_ns();

		if (t - now > TD_SPIN_LOST_NS) {
			now = t;
			how = TD_SPIN_LOST;
			break;
		}
		now = t;
		if (now >= end) {
			how = TD_SPIN_MISS;
			break;
		}
		n = recvmsg(conn->fd, m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		if (n >= 0) {
			td_spin_record(&conn->spin, TD_SPIN_HIT, now);
			return n;
		}
		if (errno != EAGAIN && errno != EINTR)
			return n;
	}
	td_spin_record(&conn->spin, how, now);
	errno = EAGAIN;
	return -1;
}

/*
 * One recvmsg into the receive buffer, without the lock (we are the
 * reader). On success *ret_n bytes came, and got holds the descriptors
 * that came with them, owned by the caller. Its control room holds one
 * frame's descriptors: a frame's ride with its first byte in one sendmsg,
 * and one recvmsg never brings two sendmsg's worth (proto/frame.h), so a
 * truncated control message (MSG_CTRUNC) means the daemon sent more than
 * a frame may carry, and fails with -EPROTO, every descriptor closed.
 */
static int read_some(struct td_conn *conn, struct td_fdq *got, size_t *ret_n, bool block)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * TD_FRAME_MAX_FDS_REPLY)];
		struct cmsghdr align;
	} u;
	struct td_rbuf *rx = &conn->rx;
	struct iovec iov;
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	bool lost = false;
	ssize_t n;

	got->n = 0;
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
	if (!block) {
		do
			n = recvmsg(conn->fd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		while (n < 0 && errno == EINTR);
		if (n < 0 && errno == EAGAIN)
			return -EAGAIN; /* nothing there: no error set */
	} else {
		n = spin_recv(conn, &m);
	}
	/*
	 * Sleep in poll(), then read without blocking. A thread asleep in
	 * recvmsg() is woken whenever the daemon reads one of our requests
	 * (the bytes leaving the socket free write space, and that wakes every
	 * thread asleep on it), only to sleep again: a wake-up the daemon pays
	 * for before it can answer (on a VM an IPI, ~13 us, where this thread's
	 * CPU is idle). poll(POLLIN) is woken by input alone.
	 */
	while (block && n < 0 && (errno == EINTR || errno == EAGAIN)) {
		struct pollfd pfd = { .fd = conn->fd, .events = POLLIN };

		if (poll(&pfd, 1, -1) < 0 && errno != EINTR)
			n = recvmsg(conn->fd, &m, MSG_CMSG_CLOEXEC); /* sleep as before */
		else
			n = recvmsg(conn->fd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	}
	if (n < 0)
		return td_set_error(-ECONNRESET, "connection to tensord lost: %s", strerror(errno));
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t nfd = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);

		for (size_t i = 0; i < nfd; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (got->n < (int)TD_FDQ) {
				got->fd[got->n++] = fd;
			} else {
				close(fd);
				lost = true;
			}
		}
	}
	if (lost || (m.msg_flags & MSG_CTRUNC)) {
		td_fdq_clear(got);
		return td_set_error(-EPROTO,
				    "tensord sent more descriptors at once than a frame may carry "
				    "(MSG_CTRUNC)");
	}
	if (n == 0)
		return td_set_error(-ECONNRESET,
				    "connection to tensord lost: the daemon closed it");
	*ret_n = (size_t)n;
	return 0;
}

/*
 * One read for everyone, as the reader, and delivery of what it brought:
 * 0, -EAGAIN when nothing was there (block false), or -errno and the
 * connection is lost. Lock held, dropped while reading.
 */
static int read_once(tensord_client *c, bool block)
{
	struct td_conn *conn = &c->conn;
	struct td_fdq got;
	size_t n = 0;
	int r;

	conn->reading = true;
	pthread_mutex_unlock(&c->lock);
	r = read_some(conn, &got, &n, block);
	pthread_mutex_lock(&c->lock);
	conn->reading = false;
	if (r == 0) {
		r = fdq_append(&conn->fdq, &got);
		conn->rx.len += n;
		if (r == 0)
			r = deliver_frames(conn);
	}
	/* No frame will take what is queued: close it now (PipeWire's rule),
	 * and the reader's reason is every waiter's. */
	if (r < 0 && r != -EAGAIN) {
		td_fdq_clear(&conn->fdq);
		td_conn_lost(conn, r, tensord_last_error());
	}
	pthread_cond_broadcast(&conn->cond);
	return r;
}

/* Waits for p to be answered, reading for everyone when nobody else is. Lock held. */
static int wait_reply(tensord_client *c, struct td_pending *p)
{
	struct td_conn *conn = &c->conn;

	while (!p->done && !conn->closed) {
		if (conn->reading)
			pthread_cond_wait(&conn->cond, &c->lock);
		else
			read_once(c, true);
	}
	if (!p->done)
		return conn->err ? conn->err : -ENOTCONN;
	return 0;
}

int td_rpc_start(tensord_client *c, Tensord__Request *req, struct td_pending *p)
{
	int r;

	p->fd = -1;
	p->tail = &p->parts;
	pthread_mutex_lock(&c->lock);
	if (c->conn.closed) {
		r = c->conn.err ? c->conn.err : -ENOTCONN;
		pthread_mutex_unlock(&c->lock);
		return td_set_error(r, "client is closed: %s", tensord_strerror(r));
	}
	p->id = ++c->conn.next_id;
	td_idem_stamp(c, req);
	p->next = c->conn.pending;
	c->conn.pending = p;
	/* Its events may come in the read that brings its reply. */
	if (p->watch) {
		td_watch_set_id(p->watch, p->id);
		td_watch_register(&c->conn, p->watch);
	}
	pthread_mutex_unlock(&c->lock);

	req->id = p->id;
	r = send_frame(&c->conn, req);
	if (r == -EMSGSIZE) {
		/* Refused before a byte was sent: the connection is as it was. */
		char why[256];

		snprintf(why, sizeof(why), "%s", tensord_last_error());
		td_rpc_end(c, p);
		td_pending_clear(p);
		return td_set_error(r, "%s", why);
	}
	if (r < 0) {
		pthread_mutex_lock(&c->lock);
		td_conn_lost(&c->conn, r, tensord_last_error());
		pthread_mutex_unlock(&c->lock);
		td_rpc_end(c, p);
		td_pending_clear(p);
		return td_set_error(r, "%s", c->conn.why[0] ? c->conn.why : tensord_strerror(r));
	}
	return 0;
}

int td_rpc_wait(tensord_client *c, struct td_pending *p)
{
	int r;

	pthread_mutex_lock(&c->lock);
	r = wait_reply(c, p);
	pthread_mutex_unlock(&c->lock);
	return r;
}

int td_rpc_end(tensord_client *c, struct td_pending *p)
{
	int r = 0;

	pthread_mutex_lock(&c->lock);
	for (struct td_pending **pp = &c->conn.pending; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	if (!p->done)
		r = c->conn.err ? c->conn.err : -ENOTCONN;
	pthread_mutex_unlock(&c->lock);
	if (r < 0) {
		/* The reader that saw the failure may have been another thread. */
		if (c->conn.why[0])
			return td_set_error(r, "%s", c->conn.why);
		return td_set_error(r, "connection to tensord lost: %s", tensord_strerror(r));
	}
	if (p->reply && p->reply->status < 0) {
		r = p->reply->status;
		return td_set_error(r, "%s",
				    p->reply->message[0] ? p->reply->message : tensord_strerror(r));
	}
	if (!p->reply && !p->parts)
		return td_set_error(-EPROTO, "tensord answered request %llu with nothing",
				    (unsigned long long)p->id);
	return 0;
}

void td_pending_clear(struct td_pending *p)
{
	struct td_part *part;

	if (p->reply)
		tensord__reply__free_unpacked(p->reply, NULL);
	p->reply = NULL;
	if (p->fd >= 0)
		close(p->fd);
	p->fd = -1;
	while ((part = p->parts)) {
		p->parts = part->next;
		close_fds(part->fds, part->n_fds);
		free(part->fds);
		tensord__reply__free_unpacked(part->reply, NULL);
		free(part);
	}
	p->tail = &p->parts;
}

int td_rpc(tensord_client *c, Tensord__Request *req, Tensord__Reply **ret_reply, int *ret_fd)
{
	int r;

	/* Requests that make no lease may be sent from any client handle;
	 * those that do chose their client before (td_client_current()). */
	r = td_client_current(&c);
	if (r < 0)
		return r;
	return td_rpc_on(c, req, ret_reply, ret_fd);
}

int td_rpc_on(tensord_client *c, Tensord__Request *req, Tensord__Reply **ret_reply, int *ret_fd)
{
	struct td_pending p = { .fd = -1 };
	int r = td_rpc_start(c, req, &p);

	if (r < 0)
		return r;
	td_rpc_wait(c, &p);
	r = td_rpc_end(c, &p);
	if (r < 0) {
		td_pending_clear(&p);
		return r;
	}
	*ret_reply = p.reply;
	if (ret_fd)
		*ret_fd = p.fd;
	else if (p.fd >= 0)
		close(p.fd);
	return 0;
}

int td_wait_event(tensord_client *c, int timeout_ms)
{
	struct td_conn *conn = &c->conn;
	int r = 0;

	pthread_mutex_lock(&c->lock);
	if (conn->closed) {
		r = conn->err ? conn->err : -ENOTCONN;
	} else if (conn->reading) {
		/* The reader delivers for us, and wakes us when it did. */
		if (timeout_ms < 0) {
			pthread_cond_wait(&conn->cond, &c->lock);
		} else {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += timeout_ms / 1000;
			ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&conn->cond, &c->lock, &ts);
		}
	} else {
		struct pollfd pfd = { .fd = conn->fd, .events = POLLIN };
		int n;

		conn->reading = true;
		pthread_mutex_unlock(&c->lock);
		n = poll(&pfd, 1, timeout_ms);
		pthread_mutex_lock(&c->lock);
		conn->reading = false;
		if (n > 0)
			read_once(c, false);
		pthread_cond_broadcast(&conn->cond);
		if (conn->closed)
			r = conn->err ? conn->err : -ENOTCONN;
	}
	pthread_mutex_unlock(&c->lock);
	return r;
}

int td_poll(tensord_client *c)
{
	struct td_conn *conn = &c->conn;
	unsigned before;
	int r = 0;

	pthread_mutex_lock(&c->lock);
	before = conn->completed;
	/* Another thread reading delivers for us; so does a gone connection. */
	while (!conn->reading && !conn->closed && r == 0)
		r = read_once(c, false);
	r = conn->closed ? (conn->err ? conn->err : -ENOTCONN) : (int)(conn->completed - before);
	pthread_mutex_unlock(&c->lock);
	return r;
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
