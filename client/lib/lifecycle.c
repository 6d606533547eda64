/*
 * libtensord: a client's life. td_client_new() makes one, tensord_connect()
 * connects it and says Hello, td_client_current() finds the one to use in
 * a process forked from the one that connected (fork.c), tensord_close()
 * ends the connection, and the last reference frees it.
 */
#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client.h"
#include "common/desc.h"
#include "proto/frame.h"

static int connect_as(const char *socket_path, const char *name, tensord_client *before,
		      tensord_client **ret_client);

void td_client_ref(tensord_client *c)
{
	atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
}

/* Frees what conn owns; it may be half-built (fd -1, nothing received). */
static void conn_free(struct td_conn *conn)
{
	td_fdq_clear(&conn->fdq);
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
	td_fork_untrack(c);
	/* An inherited client's last lease went after its close. */
	if (c->successor)
		tensord_close(c->successor);
	/* Last reference: no thread is inside a call, no lease is alive, so
	 * the mapping cache holds only parked mappings. */
	td_relq_stop(&c->conn);
	td_reserve_stop(c);
	td_ring_close(c);
	td_bindings_fini(c);
	conn_free(&c->conn);
	td_mapcache_fini(&c->maps);
	pthread_cond_destroy(&c->reserve.cond);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

/* A created tensor's view of a ring buffer is gone (mapcache.h). */
static void lent_gone(void *arg, uint64_t ring_id)
{
	td_ring_unpin(arg, ring_id);
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
	c->maps.on_lent_gone = lent_gone;
	c->maps.on_lent_arg = c;
	LIST_INIT(&c->ipc_leases);
	LIST_INIT(&c->leases);
	td_reserve_init(&c->reserve);
	td_ring_init(&c->ring);
	c->conn.fd = fd;
	c->conn.max_request = TD_FRAME_MIN_REQUEST;
	td_spin_init(&c->conn.spin);
	td_fork_track(c);
	return c;
}

/*
 * Whether c's connection was lost, not ended by its user or a fork: the
 * daemon closed it, crashed or restarted (docs/restart.md, "Clients carry
 * on"). Lock held.
 */
static bool conn_lost(const tensord_client *c)
{
	int e = c->conn.err < 0 ? -c->conn.err : c->conn.err;

	return c->conn.closed && !c->user_closed && !c->inherited &&
	       (e == ECONNRESET || e == EPIPE || e == ECONNABORTED);
}

bool td_client_lost(tensord_client *c)
{
	bool lost;

	pthread_mutex_lock(&c->lock);
	lost = conn_lost(c);
	pthread_mutex_unlock(&c->lock);
	return lost;
}

tensord_client *td_client_latest(tensord_client *c)
{
	for (;;) {
		tensord_client *next;

		pthread_mutex_lock(&c->lock);
		next = c->successor;
		pthread_mutex_unlock(&c->lock);
		if (!next)
			return c;
		c = next;
	}
}

static void check_quiet(tensord_client *c, bool throttled);

bool tensord_lost(tensord_client *c)
{
	/* The connection serving c now, looked at as a request would look
	 * (a quiet one at its end is lost now, not at the next request). */
	c = td_client_latest(c);
	check_quiet(c, false);
	return td_client_lost(c);
}

/* How often a request looks whether the daemon ended a quiet connection. */
#define TD_CHECK_NS (100ull * 1000000ull)

/*
 * A daemon that crashed or restarted while this client sent nothing leaves
 * its connection at EOF, which nobody reads. A request looks first,
 * without waiting (one poll(), against a round trip's tens of
 * microseconds): at EOF with nothing in flight the connection is lost
 * now, so the request goes to a new one instead of failing. A bound
 * attach, which asks nothing, looks at most every TD_CHECK_NS (a clock
 * read otherwise): it stops serving what the old daemon named
 * (bindings.c) within that.
 */
static void check_quiet(tensord_client *c, bool throttled)
{
	struct timespec ts;
	struct pollfd pfd;
	uint64_t now, last;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	last = atomic_load_explicit(&c->conn.checked_ns, memory_order_relaxed);
	if (throttled && (now - last < TD_CHECK_NS ||
			  !atomic_compare_exchange_strong(&c->conn.checked_ns, &last, now)))
		return;
	if (!throttled)
		atomic_store_explicit(&c->conn.checked_ns, now, memory_order_relaxed);
	pfd = (struct pollfd){ .fd = c->conn.fd, .events = POLLRDHUP };
	if (c->conn.fd < 0 || poll(&pfd, 1, 0) != 1 || !(pfd.revents & (POLLRDHUP | POLLHUP)))
		return;
	/* Bytes before the end (a refusal, say why, as a Hello's EDQUOT does)
	 * are read the usual way: only a connection with nothing left is lost. */
	{
		char b;

		if (recv(c->conn.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) != 0)
			return;
	}
	pthread_mutex_lock(&c->lock);
	if (!c->conn.closed && !c->conn.reading && !c->conn.pending && !c->inherited)
		td_conn_lost(&c->conn, -ECONNRESET,
			     "connection to tensord lost: the daemon closed it");
	pthread_mutex_unlock(&c->lock);
}

/*
 * The leases c held move to mine when its daemon restored c's: the same
 * lineage, another instance (docs/restart.md, section 5). Both fixed since
 * their Hellos.
 */
static void readopt(tensord_client *c, tensord_client *mine)
{
	if (mine->lineage && mine->lineage == c->lineage &&
	    mine->maps.daemon_instance != c->maps.daemon_instance)
		td_lease_readopt(c, mine);
}

void td_client_idle_check(tensord_client *c)
{
	tensord_client *cur = c;
	bool lost, replaced;

	check_quiet(c, false);
	pthread_mutex_lock(&c->lock);
	lost = conn_lost(c);
	replaced = c->successor != NULL;
	pthread_mutex_unlock(&c->lock);
	/* Connecting anew re-adopts (readopt()); a failure is tried again
	 * at the flusher's next look. */
	if (lost && !replaced)
		(void)td_client_current(&cur);
}

static int current(tensord_client **pc, bool throttled)
{
	tensord_client *c = *pc, *mine;
	int r;

	for (;;) {
		bool closed, inherited, lost;
		char why[sizeof(c->conn.why)];

		check_quiet(c, throttled);
		pthread_mutex_lock(&c->lock);
		closed = c->user_closed;
		inherited = c->inherited;
		lost = conn_lost(c);
		mine = c->successor;
		snprintf(why, sizeof(why), "%s", c->conn.why);
		pthread_mutex_unlock(&c->lock);
		if (!inherited && !lost)
			break;
		if (closed)
			return td_set_error(-ENOTCONN, "client is closed");
		if (!mine) {
			/* Not under c's lock: connecting takes the list's lock,
			 * which a fork takes before c's. */
			/* A lost connection's successor keeps its token (idem.c);
			 * a forked child's is another client. */
			r = connect_as(c->path, *c->label ? c->label : NULL, lost ? c : NULL,
				       &mine);
			if (r < 0) {
				/* A copy: the message is written over the buffer
				 * tensord_last_error() gives. */
				char failed[sizeof(why)];

				snprintf(failed, sizeof(failed), "%s", tensord_last_error());
				if (inherited)
					return td_set_error(
						r,
						"this process (pid %d) was forked from the one "
						"that connected, and connecting anew to %s "
						"failed: %s",
						(int)getpid(), c->path, failed);
				/* The daemon is not back (yet): no daemon, a
				 * ConnectionRefusedError in Python. So is one
				 * that took the connect and died before its
				 * Hello (killed in the middle of a restart). */
				if (r == -ENOENT || r == -ENOTSOCK || r == -ECONNRESET ||
				    r == -EPIPE || r == -ECONNABORTED)
					r = -ECONNREFUSED;
				return td_set_error(
					r,
					"connection to tensord at %s was lost (%s), and "
					"connecting anew failed: %s",
					c->path, why, failed);
			}
			pthread_mutex_lock(&c->lock);
			if (c->successor || c->user_closed) {
				/* Another thread was quicker, or closed it. */
				pthread_mutex_unlock(&c->lock);
				tensord_close(mine);
				continue;
			}
			c->successor = mine;
			mine->epoch = c->epoch + (lost ? 1 : 0);
			pthread_mutex_unlock(&c->lock);
			if (lost)
				readopt(c, mine);
		}
		c = mine;
	}
	*pc = c;
	return 0;
}

int td_client_current(tensord_client **pc)
{
	return current(pc, false);
}

int td_client_current_bound(tensord_client **pc)
{
	return current(pc, true);
}

/* --- waits across a lost connection (docs/restart.md, "Clients carry on") --- */

/* How long a wait without a deadline tries to reach a daemon that is gone (TENSORD_RECONNECT_MS). */
#define TD_RECONNECT_GRACE_MS 30000

/*
 * How long a request that does not wait (a read) waits for a new daemon at
 * most: a restart's time (systemd's RestartSec= is 100 ms by default, a
 * daemon starts in tens of ms), not a wait's, so that a read on a client
 * whose daemon is gone for good says so soon.
 */
#define TD_READ_RECONNECT_MS 2000

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void td_retry_begin(struct td_retry *rt, tensord_client *c, int timeout_ms)
{
	memset(rt, 0, sizeof(*rt));
	rt->c = c;
	rt->epoch = tensord_epoch(c);
	rt->seen = rt->epoch;
	rt->lineage = tensord_lineage(c);
	rt->start_ns = now_ns();
	rt->timeout_ms = timeout_ms;
}

uint64_t td_after_for(const tensord_client *cur, const struct td_retry *rt, uint64_t after)
{
	if (!after || !rt) /* nothing to keep, or no wait (NULL) */
		return after;
	if (cur->epoch == rt->epoch || (rt->lineage && cur->lineage == rt->lineage))
		return after;
	return 0;
}

uint64_t tensord_lineage(tensord_client *c)
{
	uint64_t l;

	for (;;) {
		tensord_client *next;

		pthread_mutex_lock(&c->lock);
		l = c->lineage;
		next = c->successor;
		pthread_mutex_unlock(&c->lock);
		if (!next)
			return l;
		c = next;
	}
}

unsigned tensord_epoch(tensord_client *c)
{
	unsigned e;

	for (;;) {
		tensord_client *next;

		pthread_mutex_lock(&c->lock);
		e = c->epoch;
		next = c->successor;
		pthread_mutex_unlock(&c->lock);
		if (!next)
			return e;
		c = next;
	}
}

/*
 * Whether r says the daemon went away: nobody answers at its path, or the
 * connection was lost: the one serving c is (tensord_lost()), or another
 * thread replaced it since seen, the epoch this try began in. The same
 * errno in a reply, about a peer's connection, is the daemon's answer.
 */
bool td_gone(tensord_client *c, int r, unsigned seen)
{
	if (r == -ECONNREFUSED)
		return true; /* a daemon never answers with it */
	return (r == -ECONNRESET || r == -EPIPE || r == -ECONNABORTED) &&
	       (tensord_epoch(c) != seen || tensord_lost(c));
}

uint64_t td_reconnect_grace_ms(void)
{
	const char *env = getenv("TENSORD_RECONNECT_MS");

	return env && *env ? strtoull(env, NULL, 10) : TD_RECONNECT_GRACE_MS;
}

unsigned td_reconnect_pause_ms(unsigned tries)
{
	return tries < 10 ? 10 + 10 * tries : 100;
}

bool td_retry_again(struct td_retry *rt, int r, int *timeout_ms)
{
	uint64_t grace_ms = td_reconnect_grace_ms();
	tensord_client *cur;
	char saved[512];

	if (rt->timeout_ms == 0 && grace_ms > TD_READ_RECONNECT_MS)
		grace_ms = TD_READ_RECONNECT_MS;
	if (!td_gone(rt->c, r, rt->seen))
		return false;
	/* A request that does not wait is sent once more, no more. */
	if (rt->timeout_ms == 0 && rt->resent)
		return false;
	for (;;) {
		uint64_t now = now_ns(), waited_ms = (now - rt->start_ns) / 1000000ull;

		/* The grace runs from when the daemon stopped answering, not
		 * from the wait's start: a wait of an hour gets it in full. */
		if (!rt->lost_ns)
			rt->lost_ns = now;
		/* A wait with a deadline goes on until it; every try while no
		 * daemon answers for the grace (the first is always made). */
		if (rt->timeout_ms > 0 && waited_ms >= (uint64_t)rt->timeout_ms)
			return false;
		if (rt->tries > 0 && (now - rt->lost_ns) / 1000000ull >= grace_ms)
			return false;
		if (r == -ECONNREFUSED) {
			/* Nobody there yet: a restart takes a while. */
			struct timespec ts = { 0,
					       (long)td_reconnect_pause_ms(rt->tries) * 1000000L };

			nanosleep(&ts, NULL);
		}
		rt->tries++;
		snprintf(saved, sizeof(saved), "%s", tensord_last_error());
		cur = rt->c;
		if (td_client_current(&cur) == 0) {
			rt->seen = tensord_epoch(rt->c);
			break;
		}
		r = -ECONNREFUSED;
	}
	/* A daemon answers again: a later loss gets the grace anew. */
	rt->lost_ns = 0;
	rt->tries = 0;
	rt->resent++;
	if (rt->timeout_ms > 0) {
		*timeout_ms = rt->timeout_ms - (int)((now_ns() - rt->start_ns) / 1000000ull);
		if (*timeout_ms <= 0) {
			td_set_error(r, "%s", saved);
			return false;
		}
	}
	return true;
}

int td_read(tensord_client *c, int (*call)(tensord_client *c, void *arg), void *arg)
{
	struct td_retry rt;
	int r, left = 0;

	td_retry_begin(&rt, c, 0);
	do
		r = call(c, arg);
	while (r < 0 && td_retry_again(&rt, r, &left));
	return r;
}

/* The Hello round trip: both sides speak the same protocol version. */
static int hello(tensord_client *c, const char *path)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Hello hello = TENSORD__HELLO__INIT;
	struct td_pending p = { .fd = -1 };
	Tensord__Reply *rep;
	int r;

	hello.version = TENSORD_PROTOCOL_VERSION;
	hello.client = "libtensord";
	hello.name = c->label;
	hello.token = c->token;
	req.body_case = TENSORD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	r = td_rpc_start(c, &req, &p);
	if (r < 0)
		return r;
	/*
	 * A socket kept by a service manager or a holder accepts connections
	 * while no daemon serves it (a restart, docs/restart.md): the connect
	 * succeeds and nobody answers. Connecting never waits for that longer
	 * than the reconnect grace (TENSORD_RECONNECT_MS, 30 s).
	 */
	{
		const char *env = getenv("TENSORD_RECONNECT_MS");
		long grace = env && *env ? strtol(env, NULL, 10) : 30000;
		struct pollfd pfd = { .fd = c->conn.fd, .events = POLLIN };

		while ((r = poll(&pfd, 1, grace > INT_MAX ? INT_MAX : (int)grace)) < 0 &&
		       errno == EINTR)
			;
		if (r == 0) {
			td_rpc_end(c, &p);
			td_pending_clear(&p);
			return td_set_error(
				-ECONNREFUSED,
				"no tensord answered at %s within %ld ms: the socket "
				"accepts, but no daemon serves it (a restart under way?)",
				path, grace);
		}
	}
	td_rpc_wait(c, &p);
	r = td_rpc_end(c, &p);
	if (r < 0) {
		td_pending_clear(&p);
		return r;
	}
	rep = p.reply;
	if (rep->body_case != TENSORD__REPLY__BODY_HELLO ||
	    rep->hello->version != TENSORD_PROTOCOL_VERSION)
		r = td_set_error(-EPROTO, "tensord at %s speaks another protocol version", path);
	else {
		c->maps.daemon_instance = rep->hello->instance;
		c->lineage = rep->hello->lineage;
	}
	if (r == 0 && rep->hello->max_frame > TD_FRAME_MIN_REQUEST)
		c->conn.max_request = rep->hello->max_frame < TD_FRAME_MAX_REQUEST
					      ? rep->hello->max_frame
					      : TD_FRAME_MAX_REQUEST;
	tensord__reply__free_unpacked(rep, NULL);
	return r;
}

/*
 * The label a connection gets: name, else $TENSORD_CLIENT_NAME, else none
 * (""), in label; 0, or -EINVAL saying which was not valid and why.
 */
static int connect_label(const char *name, char *label, size_t len)
{
	const char *env = getenv("TENSORD_CLIENT_NAME");
	const char *what = "client name";
	char why[160];

	if (!name && env && *env) {
		name = env;
		what = "$TENSORD_CLIENT_NAME";
	}
	if (!name) {
		*label = '\0';
		return 0;
	}
	if (td_label_check(name, why, sizeof(why)) < 0) {
		char q[96];

		td_name_quote(name, strnlen(name, 256), q, sizeof(q));
		return td_set_error(-EINVAL, "%s %s: %s", what, q, why);
	}
	snprintf(label, len, "%s", name);
	return 0;
}

int tensord_connect_named(const char *socket_path, const char *name, tensord_client **ret_client)
{
	return connect_as(socket_path, name, NULL, ret_client);
}

/*
 * A connection to socket_path; before (NULL: none) is the one it follows
 * after a lost connection, whose token and seqs it goes on with (idem.c).
 */
static int connect_as(const char *socket_path, const char *name, tensord_client *before,
		      tensord_client **ret_client)
{
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char label[TENSORD_LABEL_MAX + 1];
	tensord_client *c;
	int r;

	td_clear_error();
	r = connect_label(name, label, sizeof(label));
	if (r < 0)
		return r;
	c = td_client_new(-1);
	if (!c)
		return td_set_error(-ENOMEM, "out of memory");
	memcpy(c->label, label, sizeof(label));
	c->token = before ? before->token : td_token_new();
	if (before) {
		pthread_mutex_lock(&before->lock);
		c->seq = before->seq;
		pthread_mutex_unlock(&before->lock);
	}
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

int tensord_connect(const char *socket_path, tensord_client **ret_client)
{
	return tensord_connect_named(socket_path, NULL, ret_client);
}

tensord_client *tensord_close(tensord_client *c)
{
	tensord_client *mine;

	if (!c)
		return NULL;
	/* Its successor (a fork's, or one made when the connection was lost) goes too. */
	pthread_mutex_lock(&c->lock);
	mine = c->successor;
	c->successor = NULL;
	c->user_closed = true;
	pthread_mutex_unlock(&c->lock);
	tensord_close(mine);
	if (c->inherited) {
		/* Never the parent's connection: only this process's own. */
		td_client_unref(c);
		return NULL;
	}
	/*
	 * The daemon frees what this connection leased once it sees EOF. For
	 * memory it exports itself (legacy CUDA IPC, HIP IPC) that is undefined
	 * behaviour while we still have it open, so close those handles first;
	 * leases still alive then point at unmapped memory (docs/gpu.md). Then
	 * release those leases, and send every Release still queued: a legacy
	 * IPC lease the daemon finds held at EOF is one it must assume still
	 * open, and it keeps that memory until this process exits.
	 */
	td_mapcache_revoke(&c->maps);
	td_lease_release_ipc(c);
	/* Bindings no local lease uses end now; the daemon ends the rest at EOF. */
	td_bindings_close(c);
	td_relq_flush(&c->conn);
	pthread_mutex_lock(&c->lock);
	td_conn_lost(&c->conn, -ENOTCONN, NULL);
	/* Wakes a reader blocked in recvmsg; the daemon sees EOF and ends
	 * every lease of this connection. */
	shutdown(c->conn.fd, SHUT_RDWR);
	pthread_mutex_unlock(&c->lock);
	/* Its round trips fail now; the daemon freed its reserves at EOF. */
	td_reserve_stop(c);
	td_client_unref(c);
	return NULL;
}
