/*
 * libtensord: the connection. Requests go out under send_lock; replies are
 * read by whichever waiting thread gets there first (the "reader"), which
 * hands each reply to the thread waiting for its id. So several threads
 * can have requests in flight, and an attach that waits for a publish does
 * not block other threads' calls.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client.h"
#include "common/desc.h"
#include "proto/frame.h"

void td_client_ref(tensord_client *c)
{
	atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
}

void td_client_unref(tensord_client *c)
{
	if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) != 1)
		return;
	/* Last reference: no thread is inside a call, no lease is alive. */
	for (int i = 0; i < c->n_fdq; i++)
		close(c->fdq[i].fd);
	if (c->fd >= 0)
		close(c->fd);
	free(c->rbuf);
	pthread_mutex_destroy(&c->lock);
	pthread_mutex_destroy(&c->send_lock);
	pthread_cond_destroy(&c->cond);
	free(c);
}

/* Marks the connection dead and wakes every waiter. Lock held. */
static void conn_lost(tensord_client *c, int err)
{
	if (!c->closed) {
		c->closed = true;
		c->err = err;
	}
	pthread_cond_broadcast(&c->cond);
}

static int send_frame(tensord_client *c, Tensord__Request *req)
{
	uint8_t stack[1024], *buf = stack;
	size_t plen = tensord__request__get_packed_size(req), len, off = 0;
	int r = 0;

	if (plen > TD_FRAME_MAX_REQUEST)
		return td_set_error(-EMSGSIZE, "request of %zu bytes is too large", plen);
	len = TD_FRAME_HEADER + plen;
	if (len > sizeof(stack)) {
		buf = malloc(len);
		if (!buf)
			return td_set_error(-ENOMEM, "out of memory");
	}
	td_frame_header(buf, (uint32_t)plen, 0);
	tensord__request__pack(req, buf + TD_FRAME_HEADER);
	pthread_mutex_lock(&c->send_lock);
	while (off < len) {
		ssize_t n = send(c->fd, buf + off, len - off, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			r = td_set_error(-errno == -EPIPE ? -ECONNRESET : -errno,
					 "connection to tensord lost: %s", strerror(errno));
			break;
		}
		off += (size_t)n;
	}
	pthread_mutex_unlock(&c->send_lock);
	if (buf != stack)
		free(buf);
	return r;
}

/* Takes the descriptor that came with the frame starting at stream offset pos. */
static int take_fd(tensord_client *c, uint64_t pos)
{
	int fd = -1, j = 0;

	for (int i = 0; i < c->n_fdq; i++) {
		if (fd < 0 && c->fdq[i].start <= pos && pos < c->fdq[i].end) {
			fd = c->fdq[i].fd;
		} else if (c->fdq[i].end <= pos) {
			close(c->fdq[i].fd); /* stray: no frame claimed it */
		} else {
			c->fdq[j++] = c->fdq[i];
		}
	}
	c->n_fdq = j;
	return fd;
}

/* Delivers every complete frame in rbuf. Lock held. */
static int deliver_frames(tensord_client *c)
{
	size_t off = 0;

	for (;;) {
		struct td_frame f;
		long n = td_frame_parse(c->rbuf + off, c->rlen - off, TD_FRAME_MAX_REPLY, &f);
		Tensord__Reply *rep;
		int fd = -1;

		if (n == 0)
			break;
		if (n < 0)
			return td_set_error((int)n, "tensord sent a bad frame: %s", tensord_strerror((int)n));
		if (f.flags & TD_FRAME_FLAG_FD) {
			fd = take_fd(c, c->rpos + off);
			if (fd < 0)
				return td_set_error(-EPROTO, "tensord sent a frame without its descriptor");
		}
		rep = tensord__reply__unpack(NULL, f.len, f.payload);
		off += (size_t)n;
		if (!rep) {
			if (fd >= 0)
				close(fd);
			return td_set_error(-EBADMSG, "tensord sent a malformed reply");
		}
		struct td_pending *p;
		for (p = c->pending; p; p = p->next)
			if (p->id == rep->id && !p->done)
				break;
		if (!p) {
			/* An id 0 error is the daemon closing us for a protocol error. */
			if (rep->id == 0 && rep->status < 0) {
				td_set_error(rep->status, "%s", rep->message);
				int st = rep->status;

				tensord__reply__free_unpacked(rep, NULL);
				if (fd >= 0)
					close(fd);
				return st;
			}
			tensord__reply__free_unpacked(rep, NULL);
			if (fd >= 0)
				close(fd);
			continue;
		}
		p->done = true;
		p->reply = rep;
		p->fd = fd;
	}
	if (off) {
		memmove(c->rbuf, c->rbuf + off, c->rlen - off);
		c->rlen -= off;
		c->rpos += off;
	}
	return 0;
}

/* One recvmsg into rbuf, without the lock (we are the reader). */
static int read_some(tensord_client *c, int *ret_fd, size_t *ret_n)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * 4)];
		struct cmsghdr align;
	} u;
	struct iovec iov;
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (c->rcap - c->rlen < 4096) {
		size_t cap = c->rcap ? c->rcap * 2 : 16384;
		uint8_t *nb;

		if (cap > TD_FRAME_MAX_REPLY + 2 * TD_FRAME_HEADER + 16384)
			return td_set_error(-EMSGSIZE, "tensord sent an oversized reply");
		nb = realloc(c->rbuf, cap);
		if (!nb)
			return td_set_error(-ENOMEM, "out of memory");
		c->rbuf = nb;
		c->rcap = cap;
	}
	iov.iov_base = c->rbuf + c->rlen;
	iov.iov_len = c->rcap - c->rlen;
	m.msg_control = u.buf;
	m.msg_controllen = sizeof(u.buf);
	*ret_fd = -1;
	do
		n = recvmsg(c->fd, &m, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return td_set_error(-ECONNRESET, "connection to tensord lost: %s", strerror(errno));
	if (n == 0)
		return td_set_error(-ECONNRESET, "connection to tensord lost: the daemon closed it");
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
	while (!p->done && !c->closed) {
		if (c->reading) {
			pthread_cond_wait(&c->cond, &c->lock);
			continue;
		}
		c->reading = true;
		pthread_mutex_unlock(&c->lock);
		int fd = -1, r;
		size_t n = 0;

		r = read_some(c, &fd, &n);
		pthread_mutex_lock(&c->lock);
		c->reading = false;
		if (r == 0) {
			uint64_t start = c->rpos + c->rlen;

			if (fd >= 0) {
				if (c->n_fdq == TD_FDQ) {
					close(fd);
					r = td_set_error(-EPROTO, "tensord sent too many descriptors");
				} else {
					c->fdq[c->n_fdq].start = start;
					c->fdq[c->n_fdq].end = start + n;
					c->fdq[c->n_fdq].fd = fd;
					c->n_fdq++;
				}
			}
			c->rlen += n;
			if (r == 0)
				r = deliver_frames(c);
		}
		if (r < 0)
			conn_lost(c, r);
		pthread_cond_broadcast(&c->cond);
	}
	if (!p->done)
		return c->err ? c->err : -ENOTCONN;
	return 0;
}

int td_rpc(tensord_client *c, Tensord__Request *req, Tensord__Reply **ret_reply, int *ret_fd)
{
	struct td_pending p = { .fd = -1 };
	int r;

	pthread_mutex_lock(&c->lock);
	if (c->closed) {
		r = c->err ? c->err : -ENOTCONN;
		pthread_mutex_unlock(&c->lock);
		return td_set_error(r, "client is closed: %s", tensord_strerror(r));
	}
	p.id = ++c->next_id;
	p.next = c->pending;
	c->pending = &p;
	pthread_mutex_unlock(&c->lock);

	req->id = p.id;
	r = send_frame(c, req);

	pthread_mutex_lock(&c->lock);
	if (r < 0)
		conn_lost(c, r);
	else
		r = wait_reply(c, &p);
	for (struct td_pending **pp = &c->pending; *pp; pp = &(*pp)->next) {
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
	closed = c->closed;
	pthread_mutex_unlock(&c->lock);
	/* After a close the daemon has ended every lease already. */
	if (closed)
		return 0;
	req->id = 0;
	return send_frame(c, req);
}

int tensord_connect(const char *socket_path, tensord_client **ret_client)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char path[sizeof(sa.sun_path)];
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Hello hello = TENSORD__HELLO__INIT;
	Tensord__Reply *rep;
	tensord_client *c;
	int r;

	td_clear_error();
	if (socket_path) {
		if (strlen(socket_path) >= sizeof(path))
			return td_set_error(-ENAMETOOLONG, "socket path %s is too long", socket_path);
		snprintf(path, sizeof(path), "%s", socket_path);
	} else if (tensord_default_socket_path(path, sizeof(path)) < 0) {
		return td_set_error(-ENAMETOOLONG, "default socket path is too long");
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return td_set_error(-ENOMEM, "out of memory");
	atomic_init(&c->refs, 1);
	pthread_mutex_init(&c->lock, NULL);
	pthread_mutex_init(&c->send_lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		r = td_set_error(-errno, "socket: %s", strerror(errno));
		td_client_unref(c);
		return r;
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;

		r = td_set_error(e == ENOENT ? -ECONNREFUSED : -e, "no tensord at %s: %s", path,
				 strerror(e));
		td_client_unref(c);
		return r;
	}
	hello.version = TENSORD_PROTOCOL_VERSION;
	hello.client = "libtensord";
	req.body_case = TENSORD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	r = td_rpc(c, &req, &rep, NULL);
	if (r < 0) {
		td_client_unref(c);
		return r;
	}
	if (rep->body_case != TENSORD__REPLY__BODY_HELLO ||
	    rep->hello->version != TENSORD_PROTOCOL_VERSION) {
		tensord__reply__free_unpacked(rep, NULL);
		td_client_unref(c);
		return td_set_error(-EPROTO, "tensord at %s speaks another protocol version", path);
	}
	tensord__reply__free_unpacked(rep, NULL);
	*ret_client = c;
	return 0;
}

tensord_client *tensord_close(tensord_client *c)
{
	if (!c)
		return NULL;
	pthread_mutex_lock(&c->lock);
	conn_lost(c, -ENOTCONN);
	/* Wakes a reader blocked in recvmsg; the daemon sees EOF and ends
	 * every lease of this connection. */
	shutdown(c->fd, SHUT_RDWR);
	pthread_mutex_unlock(&c->lock);
	td_client_unref(c);
	return NULL;
}

void td_info_from_wire(tensord_info *info, const Tensord__TensorInfo *w)
{
	memset(info, 0, sizeof(*info));
	snprintf(info->name, sizeof(info->name), "%s", w->name);
	if (w->dtype)
		info->dtype = (DLDataType){ (uint8_t)w->dtype->code, (uint8_t)w->dtype->bits,
					    (uint16_t)w->dtype->lanes };
	info->ndim = (int32_t)(w->n_shape <= TENSORD_NDIM_MAX ? w->n_shape : TENSORD_NDIM_MAX);
	for (int i = 0; i < info->ndim; i++) {
		info->shape[i] = w->shape[i];
		info->strides[i] = (size_t)i < w->n_strides ? w->strides[i] : 0;
	}
	if (w->device)
		info->device = (DLDevice){ (DLDeviceType)w->device->type, w->device->id };
	info->nbytes = w->nbytes;
	info->byte_offset = w->byte_offset;
	info->state = (tensord_state)w->state;
	info->refcount = w->refcount;
	info->owner_uid = w->owner_uid;
	info->owner_gid = w->owner_gid;
	info->mode = w->mode;
	info->flags = w->flags;
	info->created_ns = w->created_ns;
	info->id = w->id;
}
