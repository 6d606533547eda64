/*
 * One client connection. Each socket is served with a uv_poll_t and our own
 * recvmsg()/sendmsg(): libuv's own fd passing only carries socket handles,
 * and we hand out memfds.
 *
 * Input: bytes accumulate in c->in until a whole frame is there; the frame
 * length is checked against TD_FRAME_MAX_REQUEST from the header alone,
 * before anything is allocated for the payload. Clients never send file
 * descriptors: any that arrive are closed and the connection is dropped.
 *
 * Output: replies go out at once when the socket takes them; what it does
 * not take is queued, and while more than CONN_OUT_HIGH bytes are queued we
 * stop reading that client's requests, so a client that never reads its
 * replies costs us at most that much memory.
 *
 * What a frame means is not decided here: frames, framing errors and the
 * close go up through set->handlers (see conn.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conn.h"
#include "log.h"
#include "proto/frame.h"

#define IN_CHUNK 4096u

static void on_poll(uv_poll_t *h, int status, int events);

static void conn_update_poll(struct conn *c)
{
	int ev = 0;

	if (c->dead)
		return;
	if (!c->closing && c->out_bytes < CONN_OUT_HIGH)
		ev |= UV_READABLE;
	if (c->out_head)
		ev |= UV_WRITABLE;
	if (ev == c->poll_events)
		return;
	c->poll_events = ev;
	if (ev)
		uv_poll_start(&c->poll, ev, on_poll);
	else
		uv_poll_stop(&c->poll);
}

void conn_set_init(struct conn_set *set, uv_loop_t *loop, const struct conn_handlers *handlers,
		   void *ctx, size_t data_size, unsigned max)
{
	memset(set, 0, sizeof(*set));
	set->loop = loop;
	set->handlers = handlers;
	set->ctx = ctx;
	set->data_size = data_size;
	set->max = max;
}

void conn_accept(struct conn_set *set, int fd)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	struct conn *c;

	/* Who the peer is comes from the kernel, never from the message body. */
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		log_warn("accept: SO_PEERCRED failed: %s, closing", strerror(errno));
		close(fd);
		return;
	}
	if (set->n >= set->max) {
		log_limited(TD_LOG_WARN, LOG_KIND_REFUSED_ACCEPT, NULL, NULL,
			    "accept: pid %d uid %u refused: %u clients is the limit", cred.pid,
			    cred.uid, set->max);
		close(fd);
		return;
	}
	c = calloc(1, sizeof(*c) + set->data_size);
	if (!c || uv_poll_init(set->loop, &c->poll, fd) < 0) {
		log_limited(TD_LOG_WARN, LOG_KIND_REFUSED_ACCEPT, NULL, NULL,
			    "accept: pid %d: out of memory, closing", cred.pid);
		free(c);
		close(fd);
		return;
	}
	c->set = set;
	c->fd = fd;
	c->id = ++set->next_id;
	c->pid = (uint32_t)cred.pid;
	c->uid = cred.uid;
	c->gid = cred.gid;
	c->poll.data = c;
	c->next = set->head;
	if (set->head)
		set->head->prev = c;
	set->head = c;
	set->n++;
	log_debug("conn %llu: pid %d uid %u gid %u connected", (unsigned long long)c->id,
		  cred.pid, cred.uid, cred.gid);
	set->handlers->on_open(c, set->ctx);
	conn_update_poll(c);
}

static void on_closed(uv_handle_t *h)
{
	struct conn *c = h->data;

	close(c->fd);
	free(c);
}

void conn_close(struct conn *c)
{
	struct conn_set *set = c->set;
	struct outbuf *o, *next;
	struct log_peer peer;

	if (c->dead)
		return;
	c->dead = true;
	/* Queued replies may carry descriptors: close them before the leases
	 * that keep their tensors alive go (in on_close). */
	for (o = c->out_head; o; o = next) {
		next = o->next;
		if (o->fd >= 0)
			close(o->fd);
		free(o);
	}
	c->out_head = c->out_tail = NULL;
	peer = conn_peer(c);
	ratelimit_flush(&c->limits, &peer, ratelimit_now());
	set->handlers->on_close(c, set->ctx);
	free(c->in);
	c->in = NULL;
	if (c->prev)
		c->prev->next = c->next;
	else
		set->head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	set->n--;
	uv_poll_stop(&c->poll);
	uv_close((uv_handle_t *)&c->poll, on_closed);
}

void conn_close_all(struct conn_set *set)
{
	while (set->head)
		conn_close(set->head);
}

void conn_shutdown(struct conn *c)
{
	c->closing = true;
	if (!c->out_head)
		conn_close(c);
	else
		conn_update_poll(c);
}

/* Sends as much of the queue as the socket takes. 0, or -errno if the peer is gone. */
static int conn_flush(struct conn *c)
{
	while (c->out_head) {
		struct outbuf *o = c->out_head;
		struct iovec iov = { o->data + o->off, o->len - o->off };
		union {
			char buf[CMSG_SPACE(sizeof(int))];
			struct cmsghdr align;
		} u;
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		/* The descriptor rides with the first byte of its frame only. */
		if (o->fd >= 0 && o->off == 0) {
			struct cmsghdr *cm;

			memset(&u, 0, sizeof(u));
			m.msg_control = u.buf;
			m.msg_controllen = sizeof(u.buf);
			cm = CMSG_FIRSTHDR(&m);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(cm), &o->fd, sizeof(int));
		}
		n = sendmsg(c->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return -errno;
		}
		if (o->fd >= 0) {
			close(o->fd);
			o->fd = -1;
		}
		o->off += (size_t)n;
		c->out_bytes -= (size_t)n;
		if (o->off == o->len) {
			c->out_head = o->next;
			if (!c->out_head)
				c->out_tail = NULL;
			free(o);
		}
	}
	return 0;
}

int conn_send(struct conn *c, const ProtobufCMessage *msg, int fd)
{
	size_t plen = protobuf_c_message_get_packed_size(msg);
	struct outbuf *o;
	int r;

	if (c->dead) {
		if (fd >= 0)
			close(fd);
		return -ENOTCONN;
	}
	o = malloc(sizeof(*o) + TD_FRAME_HEADER + plen);
	if (!o) {
		if (fd >= 0)
			close(fd);
		log_warn("conn %llu: out of memory for a reply, closing", (unsigned long long)c->id);
		conn_close(c);
		return -ENOMEM;
	}
	td_frame_header(o->data, (uint32_t)plen, fd >= 0 ? TD_FRAME_FLAG_FD : 0);
	protobuf_c_message_pack(msg, o->data + TD_FRAME_HEADER);
	o->len = TD_FRAME_HEADER + plen;
	o->off = 0;
	o->fd = fd;
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
		conn_close(c);
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
	if (!c->dead)
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
static void conn_process(struct conn *c)
{
	size_t off = 0;

	while (!c->dead && !c->closing && c->out_bytes < CONN_OUT_HIGH) {
		struct td_frame f;
		long n = td_frame_parse(c->in + off, c->in_len - off, TD_FRAME_MAX_REQUEST,
					     &f);

		if (n == 0)
			break;
		if (n == -EMSGSIZE) {
			conn_protocol_error(c, -EMSGSIZE, "frame larger than 65536 bytes");
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
	if (c->dead || c->closing || c->out_bytes >= CONN_OUT_HIGH)
		return;
	for (int rounds = 0; rounds < 16 && !c->dead && !c->closing; rounds++) {
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
		if (!c->dead && c->out_bytes >= CONN_OUT_HIGH) {
			conn_update_poll(c);
			return;
		}
	}
}

static void on_poll(uv_poll_t *h, int status, int events)
{
	struct conn *c = h->data;

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
		if (c->out_bytes < CONN_OUT_HIGH && c->in_len && !c->closing)
			conn_process(c);
		conn_update_poll(c);
	}
}
