/*
 * One client connection. Each socket is served with a uv_poll_t and our own
 * recvmsg()/sendmsg(): libuv's own fd passing only carries socket handles,
 * and we hand out memfds.
 *
 * Input: bytes accumulate in c->in until a whole frame is there; the frame
 * length is checked against TD_FRAME_MAX_REQUEST from the header alone,
 * before anything is allocated for the payload. Clients never send file
 * descriptors: any that arrive are closed and the connection is dropped,
 * and so is a frame whose header counts some (proto/frame.h).
 *
 * Output: replies go out at once when the socket takes them; what it does
 * not take is queued, and while more than CONN_OUT_HIGH bytes are queued we
 * stop reading that client's requests, so a client that never reads its
 * replies costs us at most that much memory. A reply that carries a
 * descriptor is queued with a ticket, and the descriptor is made when the
 * frame goes out; while set->fds_per_conn of them are queued or unread by
 * the peer we also stop reading, and we send no more descriptors until the
 * peer has read those (its uid's share of descriptors in flight is capped
 * too). A send refused for lack of descriptors (ETOOMANYREFS, ENOBUFS,
 * EMFILE) keeps the frame queued for set->retry; it never closes the
 * connection.
 *
 * What a frame means is not decided here: frames, framing errors and the
 * close go up through set->handlers (see conn.h). Admission, refused and
 * drained sockets and the retry timer are the set's, in conn_set.c.
 */
#include <assert.h>
#include <errno.h>
#include <linux/sockios.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conn.h"
#include "conn_int.h"
#include "daemon/base/log.h"
#include "proto/frame.h"
#include "daemon/base/quota.h"

#define IN_CHUNK 4096u

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5; the C library's headers may predate it */
#endif

static void on_poll(uv_poll_t *h, int status, int events);
static void conn_reap(uv_check_t *h);
static void conn_reap_idle(uv_idle_t *h);
void conn_process(struct conn *c);

/* The peer has read everything we sent: what was in flight has arrived. */
void conn_refresh_in_flight(struct conn *c)
{
	int outq;

	if (!c->fds_in_flight || ioctl(c->fd, SIOCOUTQ, &outq) < 0 || outq > 0)
		return;
	if (c->set->quota)
		quota_uncharge(c->set->quota, c->uid, QUOTA_FDS_IN_FLIGHT, c->fds_in_flight);
	c->fds_in_flight = 0;
}

/* c waits for the retry timer, to send or to read. Always 0. */
static int conn_block(struct conn *c)
{
	if (!c->blocked) {
		c->blocked = true;
		c->set->n_blocked++;
		c->set->fd_waits++;
		conn_retry_arm(c->set);
	}
	return 0;
}

/* Whether c has as many descriptors queued or unread as we let it. */
static bool fds_backlogged(struct conn *c)
{
	unsigned cap = c->set->fds_per_conn;

	if (!cap || c->fds_queued + c->fds_in_flight < cap)
		return false;
	conn_refresh_in_flight(c);
	return c->fds_queued + c->fds_in_flight >= cap;
}

/* Whether c has as many replies waiting as we let it: then we read no more
 * of its requests until it reads. */
bool conn_backlogged(struct conn *c)
{
	return c->out_bytes >= CONN_OUT_HIGH || fds_backlogged(c);
}

void conn_update_poll(struct conn *c)
{
	bool backlogged;
	int ev = 0;

	if (c->dead)
		return;
	if (c->failed) {
		if (c->poll_events)
			uv_poll_stop(&c->poll);
		c->poll_events = 0;
		return;
	}
	backlogged = conn_backlogged(c);
	if (!c->closing && !backlogged)
		ev |= UV_READABLE;
	/* Held back by its descriptors alone, nothing else would wake us when
	 * the peer reads them: the timer looks again. */
	if (!c->closing && backlogged && c->out_bytes < CONN_OUT_HIGH)
		conn_block(c);
	/* A blocked connection waits for the timer: its socket is writable,
	 * and level-triggered EPOLLOUT would spin. */
	if (c->out_head && !c->blocked)
		ev |= UV_WRITABLE;
	if (ev == c->poll_events)
		return;
	c->poll_events = ev;
	if (ev)
		uv_poll_start(&c->poll, ev, on_poll);
	else
		uv_poll_stop(&c->poll);
}

static void on_closed(uv_handle_t *h)
{
	struct conn *c = h->data;
	struct conn_set *set = c->set;

	if (c->drain && !set->stopping) {
		conn_drain_add(set, c);
	} else {
		close(c->fd);
		if (c->drain) {
			quota_uncharge(set->quota, c->uid, QUOTA_CLIENTS, 1);
			quota_uncharge(set->quota, c->uid, QUOTA_FDS_IN_FLIGHT, c->fds_in_flight);
		}
	}
	free(c);
}

void conn_close(struct conn *c)
{
	struct conn_set *set = c->set;
	struct outbuf *o, *next;
	struct log_peer peer;

	if (c->dead)
		return;
	if (c->failed)
		LIST_REMOVE(c, fail_link);
	c->dead = true;
	/* Queued replies hold tickets, not descriptors: nothing to close. */
	for (o = c->out_head; o; o = next) {
		next = o->next;
		if (o->tk != &o->tk1)
			free(o->tk);
		free(o);
	}
	c->out_head = c->out_tail = NULL;
	peer = conn_peer(c);
	ratelimit_flush(&c->limits, &peer, ratelimit_now());
	if (c->blocked)
		set->n_blocked--;
	c->blocked = false;
	conn_refresh_in_flight(c);
	/* With descriptors still unread at the peer, the socket and the charges
	 * go to the drain list once libuv lets go (on_closed). */
	c->drain = c->fds_in_flight > 0 && set->quota;
	if (set->quota && !c->drain)
		quota_uncharge(set->quota, c->uid, QUOTA_CLIENTS, 1);
	set->handlers->on_close(c, set->ctx);
	free(c->in);
	c->in = NULL;
	LIST_REMOVE(c, link);
	set->n--;
	uv_poll_stop(&c->poll);
	uv_close((uv_handle_t *)&c->poll, on_closed);
}

int conn_peer_pidfd(const struct conn *c)
{
	int fd = -1;
	socklen_t len = sizeof(fd);

	if (getsockopt(c->fd, SOL_SOCKET, SO_PEERPIDFD, &fd, &len) < 0)
		return -errno;
	return fd;
}

void conn_close_all(struct conn_set *set)
{
	while (!LIST_EMPTY(&set->list))
		conn_close(LIST_FIRST(&set->list));
}

void conn_shutdown(struct conn *c)
{
	if (conn_gone(c))
		return;
	c->closing = true;
	if (!c->out_head)
		conn_fail(c);
	else
		conn_update_poll(c);
}

void conn_fail(struct conn *c)
{
	struct conn_set *set = c->set;

	if (conn_gone(c))
		return;
	c->failed = true;
	c->closing = true;
	LIST_INSERT_HEAD(&set->failed, c, fail_link);
	if (!uv_is_active((uv_handle_t *)&set->reap)) {
		uv_check_start(&set->reap, conn_reap);
		uv_idle_start(&set->reap_idle, conn_reap_idle);
	}
	conn_update_poll(c);
}

static void conn_reap(uv_check_t *h)
{
	struct conn_set *set = h->data;

	/* A close may fail others (a commit answering their waiters): they join
	 * the list and go in this same loop. */
	while (!LIST_EMPTY(&set->failed))
		conn_close(LIST_FIRST(&set->failed));
	uv_check_stop(&set->reap);
	uv_idle_stop(&set->reap_idle);
}

static void conn_reap_idle(uv_idle_t *h)
{
	/* Nothing to do here: while active, it makes the loop poll without
	 * blocking, so that reap runs in this turn's check phase. */
}

/* Whether one more descriptor may go to c's peer now. */
/*
 * Whether n more descriptors may go to c now, within the connection's and
 * its uid's limits. A frame with more than a whole limit goes alone: when
 * nothing is in flight on the connection, or for its uid.
 */
static bool conn_fd_room(struct conn *c, unsigned n)
{
	struct quota *q = c->set->quota;
	unsigned lim = c->set->fds_per_conn;
	const struct uid_usage *u;

	if (lim && c->fds_in_flight + n > lim)
		conn_refresh_in_flight(c);
	if (lim && c->fds_in_flight + n > lim && !(n > lim && !c->fds_in_flight))
		return false;
	if (q && !quota_room(q, c->uid, QUOTA_FDS_IN_FLIGHT, n)) {
		conn_refresh_in_flight(c);
		if (quota_room(q, c->uid, QUOTA_FDS_IN_FLIGHT, n))
			return true;
		u = quota_get(q, c->uid);
		return n > q->lim.per_uid[QUOTA_FDS_IN_FLIGHT] &&
		       (!u || !u->n[QUOTA_FDS_IN_FLIGHT]);
	}
	return true;
}

static void outbuf_pop(struct conn *c)
{
	struct outbuf *o = c->out_head;

	c->out_head = o->next;
	if (!c->out_head)
		c->out_tail = NULL;
	if (o->n_fds && o->off == 0)
		c->fds_queued -= o->n_fds;
	c->out_bytes -= o->len - o->off;
	if (o->tk != &o->tk1)
		free(o->tk);
	free(o);
}

/*
 * The descriptors of the head frame, made now, into fds[] (o->n_fds). 0; 1
 * when the frame was dropped (its request is answered otherwise) or c
 * closed; or -EMFILE (try later, nothing held).
 */
static int conn_export(struct conn *c, struct outbuf *o, int *fds)
{
	struct conn_fd_ticket *tks = o->tk, one;
	size_t n = o->n_tk, i;
	int r = 0;

	size_t k = 0;

	for (i = 0; i < n; i++) {
		if (tks[i].no_fd)
			continue;
		r = c->set->handlers->export_fd(c, &tks[i], c->set->ctx);
		if (r < 0)
			break;
		fds[k++] = r;
	}
	if (i == n)
		return 0;
	for (size_t j = 0; j < k; j++)
		close(fds[j]);
	if (r == -EMFILE || r == -ENFILE)
		return -EMFILE;
	/* The frame goes; its tickets live on until they are answered. */
	if (tks == &o->tk1) {
		one = o->tk1;
		tks = &one;
	} else {
		o->tk = &o->tk1; /* so that outbuf_pop() leaves them */
	}
	outbuf_pop(c);
	c->set->handlers->export_failed(c, tks, n, i, r, c->set->ctx);
	if (tks != &one)
		free(tks);
	return 1;
}

/* One sendmsg of the head frame, with its n_fds descriptors fds[]. Bytes sent or -errno. */
static ssize_t conn_send_head(struct conn *c, struct outbuf *o, const int *fds, unsigned n_fds)
{
	struct iovec iov = { o->data + o->off, o->len - o->off };
	union {
		char buf[CMSG_SPACE(CONN_FDS_PER_FRAME * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	/* The descriptors ride with the first byte of their frame only. */
	if (n_fds) {
		struct cmsghdr *cm;

		memset(&u, 0, sizeof(u));
		m.msg_control = u.buf;
		m.msg_controllen = CMSG_SPACE(n_fds * sizeof(int));
		cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(n_fds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, n_fds * sizeof(int));
	}
	do
		n = sendmsg(c->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	return n < 0 ? -errno : n;
}

/* Sends as much of the queue as the socket takes. 0, or -errno if the peer is
 * gone. */
static int conn_flush_queue(struct conn *c)
{
	while (c->out_head && !conn_gone(c)) {
		struct outbuf *o = c->out_head;
		unsigned n_fds = o->off == 0 ? o->n_fds : 0;
		int fds[CONN_FDS_PER_FRAME], r;
		ssize_t n;

		if (o->off == 0 && o->n_tk) {
			if (!conn_fd_room(c, n_fds))
				return conn_block(c);
			r = conn_export(c, o, fds);
			if (r == -EMFILE)
				return conn_block(c);
			if (r > 0)
				continue;
		}
		n = conn_send_head(c, o, fds, n_fds);
		for (unsigned i = 0; i < n_fds; i++)
			close(fds[i]);
		if (n == -EAGAIN || n == -EWOULDBLOCK)
			return 0;
		/* Out of descriptors in flight (the kernel's per-user limit when
		 * we are not root) or of buffers: wait, never close for it. */
		if (n == -ETOOMANYREFS || n == -ENOBUFS || n == -EMFILE || n == -ENFILE)
			return conn_block(c);
		if (n < 0)
			return (int)n;
		if (n_fds) {
			c->fds_queued -= n_fds;
			c->fds_in_flight += n_fds;
			if (c->set->quota)
				quota_add(c->set->quota, c->uid, QUOTA_FDS_IN_FLIGHT, n_fds);
		}
		o->off += (size_t)n;
		c->out_bytes -= (size_t)n;
		if (o->off == o->len)
			outbuf_pop(c);
	}
	return 0;
}

int conn_flush(struct conn *c)
{
	int r;

	if (c->flushing || c->blocked)
		return 0;
	c->flushing = true;
	r = conn_flush_queue(c);
	c->flushing = false;
	/* Replies the socket did not take at once are gone now: tell the
	 * layer above, which may have held some back (watch events). */
	if (r == 0 && !c->out_head && c->backlog && !conn_gone(c)) {
		c->backlog = false;
		if (c->set->handlers->on_drained)
			c->set->handlers->on_drained(c, c->set->ctx);
	} else if (c->out_head) {
		c->backlog = true;
	}
	return r;
}

int conn_send(struct conn *c, const ProtobufCMessage *msg, const struct conn_fd_ticket *tk)
{
	return conn_send_fds(c, msg, tk, tk ? 1 : 0);
}

int conn_send_fds(struct conn *c, const ProtobufCMessage *msg, const struct conn_fd_ticket *tks,
		  size_t n_tk)
{
	size_t plen = protobuf_c_message_get_packed_size(msg);
	struct outbuf *o;
	int r;

	assert(n_tk <= CONN_FDS_PER_FRAME);
	if (conn_gone(c))
		return -ENOTCONN;
	if (plen > TD_FRAME_MAX_REPLY)
		return -EMSGSIZE;
	if (c->out_bytes + TD_FRAME_HEADER + plen > CONN_OUT_MAX) {
		log_warn("conn %llu: pid %u: %zu bytes of replies unread, the most one "
			 "client may "
			 "leave (%u), closing",
			 (unsigned long long)c->id, c->pid, c->out_bytes, CONN_OUT_MAX);
		conn_fail(c);
		return -ENOBUFS;
	}
	o = malloc(sizeof(*o) + TD_FRAME_HEADER + plen);
	if (!o) {
		log_warn("conn %llu: out of memory for a reply, closing",
			 (unsigned long long)c->id);
		conn_fail(c);
		return -ENOMEM;
	}
	o->tk = &o->tk1;
	if (n_tk > 1 && !(o->tk = malloc(n_tk * sizeof(*o->tk)))) {
		free(o);
		log_warn("conn %llu: out of memory for a reply, closing",
			 (unsigned long long)c->id);
		conn_fail(c);
		return -ENOMEM;
	}
	/* The descriptors are counted in the header and sent with the first byte. */
	o->n_fds = 0;
	for (size_t i = 0; i < n_tk; i++)
		o->n_fds += !tks[i].no_fd;
	td_frame_header(o->data, (uint32_t)plen, o->n_fds);
	protobuf_c_message_pack(msg, o->data + TD_FRAME_HEADER);
	o->len = TD_FRAME_HEADER + plen;
	o->off = 0;
	o->n_tk = (unsigned)n_tk;
	if (n_tk)
		memcpy(o->tk, tks, n_tk * sizeof(*tks));
	c->fds_queued += o->n_fds;
	o->next = NULL;
	if (c->out_tail)
		c->out_tail->next = o;
	else
		c->out_head = o;
	c->out_tail = o;
	c->out_bytes += o->len;

	r = conn_flush(c);
	if (r < 0) {
		log_debug("conn %llu: send failed: %s, closing", (unsigned long long)c->id,
			  strerror(-r));
		conn_fail(c);
		return r;
	}
	conn_update_poll(c);
	return 0;
}

/* Lets the layer above answer a framing error, then closes once that is sent. */
static void conn_protocol_error(struct conn *c, int status, const char *msg)
{
	conn_log_limited(c, TD_LOG_WARN, LOG_KIND_BAD_FRAME, "conn %llu: pid %u: %s, closing",
			 (unsigned long long)c->id, c->pid, msg);
	c->set->handlers->on_protocol_error(c, status, msg, c->set->ctx);
	conn_shutdown(c);
}

static void close_cmsg_fds(struct msghdr *m)
{
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(m); cm; cm = CMSG_NXTHDR(m, cm)) {
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			int *fds = (int *)CMSG_DATA(cm);

			for (size_t i = 0; i < n; i++) {
				int fd;

				memcpy(&fd, fds + i, sizeof(fd));
				close(fd);
			}
		}
	}
}

/* Parses every complete frame in c->in and hands each one up. */
void conn_process(struct conn *c)
{
	size_t off = 0;

	while (!conn_gone(c) && !c->closing && !conn_backlogged(c)) {
		struct td_frame f;
		long n = td_frame_parse(c->in + off, c->in_len - off, TD_FRAME_MAX_REQUEST,
					TD_FRAME_MAX_FDS_REQUEST, &f);

		if (n == 0)
			break;
		if (n == -EMSGSIZE) {
			char why[64];

			snprintf(why, sizeof(why), "frame larger than %u bytes",
				 TD_FRAME_MAX_REQUEST);
			conn_protocol_error(c, -EMSGSIZE, why);
			return;
		}
		if (n == -ETOOMANYREFS) {
			conn_protocol_error(c, -EPROTO,
					    "frame counting descriptors; tensord accepts none");
			return;
		}
		if (n < 0) {
			conn_protocol_error(c, -EPROTO, "frame with an unknown protocol version");
			return;
		}
		c->set->handlers->on_frame(c, f.payload, f.len, c->set->ctx);
		off += (size_t)n;
	}
	if (c->dead)
		return;
	if (off) {
		memmove(c->in, c->in + off, c->in_len - off);
		c->in_len -= off;
	}
}

static void conn_read(struct conn *c)
{
	/* Frames parked while the output queue was high go first: a reply sent
	 * outside on_frame (to a waiter woken by a publish) can lower the queue
	 * and re-arm reading before on_poll() got to them. */
	if (c->in_len)
		conn_process(c);
	if (conn_gone(c) || c->closing || conn_backlogged(c))
		return;
	for (int rounds = 0; rounds < 16 && !conn_gone(c) && !c->closing; rounds++) {
		union {
			char buf[CMSG_SPACE(sizeof(int) * 8)];
			struct cmsghdr align;
		} u;
		struct iovec iov;
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (c->in_cap - c->in_len < IN_CHUNK) {
			/* Never more than one maximal frame plus a chunk. */
			size_t cap = c->in_cap ? c->in_cap * 2 : IN_CHUNK * 2;
			uint8_t *nb;

			if (cap > TD_FRAME_MAX_REQUEST + TD_FRAME_HEADER + IN_CHUNK)
				cap = TD_FRAME_MAX_REQUEST + TD_FRAME_HEADER + IN_CHUNK;
			if (cap <= c->in_cap) {
				/* A full buffer always holds a whole frame, and parked
				 * frames were processed above; this cannot happen. */
				conn_protocol_error(c, -EMSGSIZE, "input buffer full");
				return;
			}
			nb = realloc(c->in, cap);
			if (!nb) {
				conn_protocol_error(c, -ENOMEM, "out of memory for input");
				return;
			}
			c->in = nb;
			c->in_cap = cap;
		}
		iov.iov_base = c->in + c->in_len;
		iov.iov_len = c->in_cap - c->in_len;
		m.msg_control = u.buf;
		m.msg_controllen = sizeof(u.buf);
		n = recvmsg(c->fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			log_debug("conn %llu: recv: %s, closing", (unsigned long long)c->id,
				  strerror(errno));
			conn_close(c);
			return;
		}
		if (m.msg_controllen > 0 || (m.msg_flags & MSG_CTRUNC)) {
			close_cmsg_fds(&m);
			conn_protocol_error(c, -EPROTO,
					    "client sent file descriptors; tensord accepts none");
			return;
		}
		if (n == 0) {
			conn_close(c);
			return;
		}
		c->in_len += (size_t)n;
		conn_process(c);
		if (!conn_gone(c) && conn_backlogged(c)) {
			conn_update_poll(c);
			return;
		}
	}
}

static void on_poll(uv_poll_t *h, int status, int events)
{
	struct conn *c = h->data;

	if (c->failed) /* its close is on the way (conn_fail()) */
		return;
	if (status < 0) {
		log_debug("conn %llu: poll error %s, closing", (unsigned long long)c->id,
			  uv_strerror(status));
		conn_close(c);
		return;
	}
	if (events & UV_WRITABLE) {
		int r = conn_flush(c);

		if (r < 0) {
			conn_close(c);
			return;
		}
		if (c->closing && !c->out_head) {
			conn_close(c);
			return;
		}
	}
	if ((events & UV_READABLE) && !c->dead)
		conn_read(c);
	if (!c->dead) {
		/* Requests parked while the output queue was high can go on now. */
		if (!conn_backlogged(c) && c->in_len && !c->closing)
			conn_process(c);
		conn_update_poll(c);
	}
}
