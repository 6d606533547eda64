/*
 * The set of client connections (conn.h): admission (the limits on
 * connections, per uid and the descriptor reserve), refused connections
 * kept open a moment so their peer reads why, closed connections whose
 * peer has not read our descriptors yet (drained), and the one retry timer
 * that serves connections waiting to send. One connection's own I/O is in
 * conn.c; what the two share is in conn_int.h.
 */
#include <errno.h>
#include <linux/sockios.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conn.h"
#include "conn_int.h"
#include "daemon/base/log.h"
#include "daemon/base/quota.h"

#define RETRY_MS 10
#define LINGER_MS 500

static void on_retry(uv_timer_t *h);

void conn_set_init(struct conn_set *set, uv_loop_t *loop, const struct conn_handlers *handlers,
		   void *ctx, size_t data_size, unsigned max)
{
	memset(set, 0, sizeof(*set));
	LIST_INIT(&set->list);
	set->loop = loop;
	set->handlers = handlers;
	set->ctx = ctx;
	set->data_size = data_size;
	set->max = max;
	uv_timer_init(loop, &set->retry);
	set->retry.data = set;
	LIST_INIT(&set->failed);
	uv_check_init(loop, &set->reap);
	set->reap.data = set;
	uv_idle_init(loop, &set->reap_idle);
	set->reap_idle.data = set;
}

void conn_retry_arm(struct conn_set *set)
{
	if (!uv_is_active((uv_handle_t *)&set->retry))
		uv_timer_start(&set->retry, on_retry, RETRY_MS, RETRY_MS);
}

/*
 * Answers a connection we will not serve with an id-0 error (which the
 * library reports from tensord_connect) and keeps it open a little, so the
 * peer reads the reason before it sees the close. Takes ownership of fd.
 */
static void conn_refuse(struct conn_set *set, int fd, int status, const char *msg)
{
	uint8_t buf[512];
	size_t n = set->handlers->pack_refusal
			   ? set->handlers->pack_refusal(buf, sizeof(buf), status, msg)
			   : 0;

	if (n && send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
		n = 0;
	if (!n || shutdown(fd, SHUT_WR) < 0) {
		close(fd);
		return;
	}
	if (set->n_linger == CONN_LINGER_MAX) {
		close(set->linger_fd[0]);
		memmove(set->linger_fd, set->linger_fd + 1, (CONN_LINGER_MAX - 1) * sizeof(int));
		memmove(set->linger_until, set->linger_until + 1,
			(CONN_LINGER_MAX - 1) * sizeof(uint64_t));
		set->n_linger--;
	}
	set->linger_fd[set->n_linger] = fd;
	set->linger_until[set->n_linger++] = uv_now(set->loop) + LINGER_MS;
	conn_retry_arm(set);
}

static void linger_expire(struct conn_set *set, bool all)
{
	unsigned i = 0;

	while (i < set->n_linger && (all || set->linger_until[i] <= uv_now(set->loop)))
		close(set->linger_fd[i++]);
	memmove(set->linger_fd, set->linger_fd + i, (set->n_linger - i) * sizeof(int));
	memmove(set->linger_until, set->linger_until + i, (set->n_linger - i) * sizeof(uint64_t));
	set->n_linger -= i;
}

/*
 * Sockets of closed connections whose peer still has descriptors of ours
 * unread: closing them would drop the count, not the descriptors, which
 * stay queued at the peer and count against the daemon user's kernel limit
 * (a client that half-closes could repeat that). So the socket stays open,
 * shut down, and its uid stays charged (a connection and its descriptors)
 * until the peer has read them or closed its end. all: close them now.
 */
static void drain_check(struct conn_set *set, bool all)
{
	for (unsigned i = 0; i < set->n_drain;) {
		struct conn_drain *d = &set->drain[i];
		int outq;

		if (!all && ioctl(d->fd, SIOCOUTQ, &outq) == 0 && outq > 0) {
			i++;
			continue;
		}
		close(d->fd);
		if (set->quota) {
			quota_uncharge(set->quota, d->uid, QUOTA_CLIENTS, 1);
			quota_uncharge(set->quota, d->uid, QUOTA_FDS_IN_FLIGHT, d->fds_in_flight);
		}
		*d = set->drain[--set->n_drain];
	}
}

/* Takes ownership of c's socket (closed on every path) and of its charges. */
void conn_drain_add(struct conn_set *set, struct conn *c)
{
	if (set->n_drain == set->cap_drain) {
		unsigned cap = set->cap_drain ? set->cap_drain * 2 : 16;
		struct conn_drain *nd = realloc(set->drain, cap * sizeof(*nd));

		if (!nd) {
			close(c->fd);
			quota_uncharge(set->quota, c->uid, QUOTA_CLIENTS, 1);
			quota_uncharge(set->quota, c->uid, QUOTA_FDS_IN_FLIGHT, c->fds_in_flight);
			return;
		}
		set->drain = nd;
		set->cap_drain = cap;
	}
	shutdown(c->fd, SHUT_RDWR);
	set->drain[set->n_drain++] = (struct conn_drain){ c->fd, c->uid, c->fds_in_flight };
	conn_retry_arm(set);
}

void conn_set_fini(struct conn_set *set)
{
	set->stopping = true;
	drain_check(set, true);
	free(set->drain);
	set->drain = NULL;
	set->n_drain = set->cap_drain = 0;
	linger_expire(set, true);
	uv_timer_stop(&set->retry);
	uv_close((uv_handle_t *)&set->retry, NULL);
	uv_close((uv_handle_t *)&set->reap, NULL);
	uv_close((uv_handle_t *)&set->reap_idle, NULL);
}

/* Whether the peer (or the limits) let set serve one more connection of uid
 * on descriptor fd; if not, the reason is in why. */
static int conn_admit(struct conn_set *set, int fd, const struct ucred *cred, char *why,
		      size_t why_len)
{
	struct quota *q = set->quota;

	if (set->n >= set->max) {
		snprintf(why, why_len, "tensord serves %u clients, its limit (--max-clients)",
			 set->max);
		return -EAGAIN;
	}
	if (!q)
		return 0;
	/* fd is the lowest free number: at the reserve means full. */
	if (cred->uid != 0 && !quota_exempt(q, cred->uid) && q->lim.fd_budget &&
	    (unsigned)fd >= q->lim.fd_budget - q->lim.fd_reserve) {
		snprintf(why, why_len,
			 "tensord's descriptors are all in use but the %u it keeps "
			 "for root (RLIMIT_NOFILE %u)",
			 q->lim.fd_reserve, q->lim.fd_budget);
		return -ENOSPC;
	}
	return quota_charge(q, cred->uid, QUOTA_CLIENTS, 1, why, why_len);
}

void conn_accept(struct conn_set *set, int fd)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	char why[200];
	struct conn *c;
	int r;

	/* Who the peer is comes from the kernel, never from the message body. */
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		log_warn("accept: SO_PEERCRED failed: %s, closing", strerror(errno));
		close(fd);
		return;
	}
	r = conn_admit(set, fd, &cred, why, sizeof(why));
	if (r < 0) {
		log_limited(TD_LOG_WARN, LOG_KIND_REFUSED_ACCEPT, NULL, NULL,
			    "accept: pid %d uid %u refused: %s", cred.pid, cred.uid, why);
		conn_refuse(set, fd, r, why);
		return;
	}
	c = calloc(1, sizeof(*c) + set->data_size);
	if (!c || uv_poll_init(set->loop, &c->poll, fd) < 0) {
		log_limited(TD_LOG_WARN, LOG_KIND_REFUSED_ACCEPT, NULL, NULL,
			    "accept: pid %d: out of memory, closing", cred.pid);
		if (set->quota)
			quota_uncharge(set->quota, cred.uid, QUOTA_CLIENTS, 1);
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
	LIST_INSERT_HEAD(&set->list, c, link);
	set->n++;
	log_debug("conn %llu: pid %d uid %u gid %u connected", (unsigned long long)c->id, cred.pid,
		  cred.uid, cred.gid);
	set->handlers->on_open(c, set->ctx);
	conn_update_poll(c);
}

/* Every tick while some connection waits: what its peers read, then retry. */
static void on_retry(uv_timer_t *h)
{
	struct conn_set *set = h->data;
	struct conn *c, *next;

	linger_expire(set, false);
	drain_check(set, false);
	if (set->n_blocked) {
		LIST_FOREACH(c, &set->list, link)
		conn_refresh_in_flight(c);
		for (c = LIST_FIRST(&set->list); c; c = next) {
			next = LIST_NEXT(c, link);
			/* Serving one may close others (a publish answers waiters). */
			if (conn_gone(c) || !c->blocked)
				continue;
			c->blocked = false;
			set->n_blocked--;
			if (conn_flush(c) < 0) {
				conn_close(c);
				continue;
			}
			if (c->closing && !c->out_head) {
				conn_close(c);
				continue;
			}
			/* Requests parked while it was backlogged can go on now. */
			if (!conn_backlogged(c) && c->in_len && !c->closing)
				conn_process(c);
			conn_update_poll(c);
		}
	}
	if (!set->n_blocked && !set->n_linger && !set->n_drain)
		uv_timer_stop(h);
}
