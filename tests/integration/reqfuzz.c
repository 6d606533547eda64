/*
 * reqfuzz: a structure-aware request-sequence fuzzer for tensord.
 *
 *   reqfuzz --socket PATH [--seed N] [--seconds S] [--count N] [--conns K] [--verbose]
 *
 * It keeps up to K connections open to the daemon and sends, on them, valid
 * requests of every kind proto/tensord.proto defines (built with protobuf-c,
 * as a client's), mutated: names, sizes, dtypes, devices, flags, modes,
 * timeouts, ids. What the replies hand out is learnt and used again, on any
 * connection: names, lease ids, tensor ids, share ids, generations, commit
 * ids, reserve ids, and the ids of its own parked attaches and watches (for
 * Cancel and Unwatch); transactions are numbered by the client and reused.
 * It pipelines requests in one write and closes sockets abruptly at chosen
 * points, most of all right after a request whose answer the daemon sends
 * from inside a commit (an attach woken by a put on the same connection, a
 * watch's replay, watchers of a prefix another connection publishes into,
 * a connection-lifetime tensor whose unlink commits as its connection
 * ends, a transaction's commit). The descriptors it receives (memfds, slab
 * and reserve memfds, binding pages) are written, resized, sealed, mapped
 * and written through, closed, or sent back to the daemon with a request.
 * Now and then a packed frame is corrupted too.
 *
 * --verbose prints the first refusals of each request kind and errno with
 * the daemon's words, and a count each second.
 *
 * Seeded: the seed is printed first (--seed makes it fixed); what it does
 * is drawn from the seed and the replies it learnt from, so a seed replays
 * the same choices as long as the daemon answers the same. Bounded by
 * --seconds (default 10) and --count (requests; default none).
 *
 * At the end it closes everything, connects once more and checks that the
 * daemon answers (Hello, a Put, an Attach of it, Stats). Exit status 0 when
 * it did; 2 when the daemon stopped answering (the time and request count
 * when that was first seen are printed: under ASan that is the crash, and
 * the daemon's log holds the report); 1 for a usage error.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <tensord/tensord.h>

#include "proto/frame.h"
#include "proto/tensord.pb-c.h"

#define CONNS_MAX 32
#define POOL 64
#define FDS_MAX 32
#define PENDING 64

/* --- the random source: splitmix64, one stream from the seed ---------------- */

static uint64_t rng_state;

static uint64_t rnd(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

/* True with probability pct percent. */
static bool chance(unsigned pct)
{
	return below(100) < pct;
}

/* --- what was learnt ------------------------------------------------------ */

struct pool {
	uint64_t v[POOL];
	unsigned n, next;
};

static void pool_add(struct pool *p, uint64_t v)
{
	if (!v)
		return;
	p->v[p->next] = v;
	p->next = (p->next + 1) % POOL;
	if (p->n < POOL)
		p->n++;
}

/* A learnt value, or a mutation of one, or an arbitrary one. */
static uint64_t pool_pick(const struct pool *p)
{
	uint64_t v;

	if (!p->n || chance(8)) {
		switch (below(4)) {
		case 0:
			return 0;
		case 1:
			return UINT64_MAX - below(2);
		case 2:
			return below(64);
		default:
			return rnd();
		}
	}
	v = p->v[below(p->n)];
	if (chance(10))
		v += below(3) - 1;
	return v;
}

static struct pool leases, tensor_ids, share_ids, gens, commits, reserves, conn_ids;
static char names[POOL][TENSORD_NAME_MAX + 1];
static unsigned n_names, next_name;

static void learn_name(const char *s)
{
	if (!s || !*s || strlen(s) > TENSORD_NAME_MAX)
		return;
	for (unsigned i = 0; i < n_names; i++)
		if (strcmp(names[i], s) == 0)
			return;
	snprintf(names[next_name], sizeof(names[0]), "%s", s);
	next_name = (next_name + 1) % POOL;
	if (n_names < POOL)
		n_names++;
}

/*
 * Descriptors the daemon handed out, for hostile use. A descriptor kept
 * keeps its memory alive after the daemon freed it (docs/security.md, "What
 * a reader can pin"), uncounted: the fuzzer keeps few and small ones, so
 * that it does not hoard the machine's memory.
 */
#define FD_BYTES_MAX (32ull << 20)
static int fds[FDS_MAX];
static unsigned n_fds;

static void keep_fd(int fd)
{
	struct stat st;

	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size > FD_BYTES_MAX / 8 || chance(50)) {
		close(fd);
		return;
	}
	if (n_fds == FDS_MAX) {
		unsigned i = (unsigned)below(FDS_MAX);

		close(fds[i]);
		fds[i] = fd;
		return;
	}
	fds[n_fds++] = fd;
}

/* --- figures -------------------------------------------------------------- */

static uint64_t sent[32], ok_by_kind[32], statuses[256], replies, fds_got, dropped_by_daemon,
	abrupt, corrupted, fd_ops, passed_back;
static bool verbose;

/* --- connections ---------------------------------------------------------- */

struct conn {
	int fd;
	uint64_t next_id;
	uint8_t *in;
	size_t in_len, in_cap;
	uint64_t parked[PENDING]; /* ids of its attaches and watches, for Cancel/Unwatch */
	unsigned n_parked;
	uint32_t txs[8];
	unsigned n_txs;
	/* The request kind of each id, by id % 4096, for the figures of what
	 * succeeded: about right (ids are reused on purpose now and then). */
	uint8_t kind_of[4096];
};

static struct conn conns[CONNS_MAX];
static unsigned n_conns = 8;
static const char *sock_path;
static double t_start;
static uint64_t n_requests;
static double gone_at = -1;
static uint64_t gone_after;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int dial(void)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock_path);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	return fd;
}

static void conn_drop(struct conn *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->in_len = 0;
	c->n_parked = 0;
	c->n_txs = 0;
}

/* The daemon no longer accepts: remember when that was first seen. */
static void note_gone(int err)
{
	if (gone_at >= 0)
		return;
	gone_at = now() - t_start;
	gone_after = n_requests;
	fprintf(stderr,
		"reqfuzz: the daemon stopped accepting after %.2f s and %" PRIu64
		" requests: connect: %s\n",
		gone_at, gone_after, strerror(err));
}

static void learn_lease(const Tensord__Lease *l)
{
	if (!l)
		return;
	pool_add(&leases, l->lease);
	pool_add(&share_ids, l->share_id);
	pool_add(&reserves, l->reserve);
	pool_add(&reserves, l->ring); /* Unreserve takes ring buffers' ids too */
	if (l->info) {
		learn_name(l->info->name);
		pool_add(&tensor_ids, l->info->id);
		pool_add(&gens, l->info->generation);
		pool_add(&commits, l->info->commit);
	}
}

static void learn(struct conn *c, const Tensord__Reply *r)
{
	size_t i;

	replies++;
	if (r->status == 0 && r->id)
		ok_by_kind[c->kind_of[r->id % 4096]]++;
	if (verbose && r->status < 0 && r->status > -256 && r->id) {
		/* The first few refusals of each kind and errno, with the daemon's words. */
		static uint32_t told[32][256];
		unsigned k = c->kind_of[r->id % 4096];

		if (told[k][-r->status]++ < 2)
			fprintf(stderr, "reqfuzz: kind %u: %s: %s\n", k,
				strerrorname_np(-r->status), r->message);
	}
	statuses[r->status < 0 && r->status > -256 ? -r->status : 0]++;
	switch (r->body_case) {
	case TENSORD__REPLY__BODY_LEASE:
		learn_lease(r->lease);
		break;
	case TENSORD__REPLY__BODY_INFO:
		learn_name(r->info->name);
		pool_add(&tensor_ids, r->info->id);
		pool_add(&gens, r->info->generation);
		break;
	case TENSORD__REPLY__BODY_LIST:
		for (i = 0; i < r->list->n_tensors; i++)
			learn_name(r->list->tensors[i]->name);
		break;
	case TENSORD__REPLY__BODY_PUBLISHED:
		pool_add(&gens, r->published->generation);
		pool_add(&commits, r->published->commit);
		break;
	case TENSORD__REPLY__BODY_COMMIT:
		pool_add(&commits, r->commit->commit);
		break;
	case TENSORD__REPLY__BODY_ATTACH_MANY:
		pool_add(&commits, r->attach_many->commit);
		for (i = 0; i < r->attach_many->n_leases; i++)
			learn_lease(r->attach_many->leases[i]);
		break;
	case TENSORD__REPLY__BODY_EVENTS:
		for (i = 0; i < r->events->n_events; i++) {
			learn_name(r->events->events[i]->name);
			pool_add(&gens, r->events->events[i]->generation);
			pool_add(&commits, r->events->events[i]->commit);
		}
		break;
	case TENSORD__REPLY__BODY_RESERVE:
		pool_add(&reserves, r->reserve->id);
		break;
	case TENSORD__REPLY__BODY_LEASE_LIST:
		for (i = 0; i < r->lease_list->n_holders; i++) {
			pool_add(&tensor_ids, r->lease_list->holders[i]->tensor_id);
			pool_add(&conn_ids, r->lease_list->holders[i]->conn_id);
		}
		break;
	case TENSORD__REPLY__BODY_CLIENT_LIST:
		for (i = 0; i < r->client_list->n_clients; i++)
			pool_add(&conn_ids, r->client_list->clients[i]->conn_id);
		break;
	default:
		break;
	}
}

/* Cuts the complete frames off c->in and learns from each. */
static void parse_in(struct conn *c)
{
	size_t off = 0;

	while (off < c->in_len) {
		struct td_frame f;
		long n = td_frame_parse(c->in + off, c->in_len - off, TD_FRAME_MAX_REPLY,
					TD_FRAME_FDS_COUNTABLE, &f);
		Tensord__Reply *r;

		if (n == 0)
			break;
		if (n < 0) {
			fprintf(stderr, "reqfuzz: a reply frame the client cannot parse: %s\n",
				strerror((int)-n));
			conn_drop(c);
			return;
		}
		r = tensord__reply__unpack(NULL, f.len, f.payload);
		if (r) {
			learn(c, r);
			tensord__reply__free_unpacked(r, NULL);
		}
		off += (size_t)n;
	}
	memmove(c->in, c->in + off, c->in_len - off);
	c->in_len -= off;
}

/* Reads what is there without waiting (or up to wait_ms); false when the daemon closed it. */
static bool drain(struct conn *c, int wait_ms)
{
	for (;;) {
		union {
			struct cmsghdr h;
			char buf[CMSG_SPACE(sizeof(int) * (TD_FRAME_FDS_COUNTABLE + 4))];
		} ctl;
		struct iovec iov;
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (c->fd < 0)
			return false;
		if (wait_ms > 0) {
			struct pollfd p = { .fd = c->fd, .events = POLLIN };

			if (poll(&p, 1, wait_ms) <= 0)
				return true;
			wait_ms = 0;
		}
		if (c->in_cap - c->in_len < 65536) {
			size_t cap = c->in_cap ? c->in_cap * 2 : 262144;
			uint8_t *p = realloc(c->in, cap);

			if (!p)
				abort();
			c->in = p;
			c->in_cap = cap;
		}
		iov.iov_base = c->in + c->in_len;
		iov.iov_len = c->in_cap - c->in_len;
		m.msg_control = ctl.buf;
		m.msg_controllen = sizeof(ctl.buf);
		n = recvmsg(c->fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return true;
		for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); n >= 0 && h; h = CMSG_NXTHDR(&m, h)) {
			if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS) {
				size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
				int *got = (int *)CMSG_DATA(h);

				for (size_t i = 0; i < k; i++) {
					fds_got++;
					keep_fd(got[i]);
				}
			}
		}
		if (n <= 0) {
			dropped_by_daemon++;
			conn_drop(c);
			return false;
		}
		c->in_len += (size_t)n;
		parse_in(c);
		if (c->fd < 0)
			return false;
	}
}

/* Sends one buffer whole (with pass_fd riding along when >= 0); false when the conn went. */
static bool send_buf(struct conn *c, const uint8_t *p, size_t len, int pass_fd)
{
	double give_up = now() + 2.0;

	while (len && c->fd >= 0) {
		union {
			struct cmsghdr h;
			char buf[CMSG_SPACE(sizeof(int))];
		} ctl;
		struct iovec iov = { .iov_base = (void *)p, .iov_len = len };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (pass_fd >= 0) {
			memset(&ctl, 0, sizeof(ctl));
			m.msg_control = ctl.buf;
			m.msg_controllen = sizeof(ctl.buf);
			CMSG_FIRSTHDR(&m)->cmsg_level = SOL_SOCKET;
			CMSG_FIRSTHDR(&m)->cmsg_type = SCM_RIGHTS;
			CMSG_FIRSTHDR(&m)->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(CMSG_FIRSTHDR(&m)), &pass_fd, sizeof(int));
		}
		n = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			p += n;
			len -= (size_t)n;
			pass_fd = -1;
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			struct pollfd pf = { .fd = c->fd, .events = POLLOUT };

			if (!drain(c, 0))
				return false;
			if (now() > give_up) {
				abrupt++;
				conn_drop(c);
				return false;
			}
			poll(&pf, 1, 20);
			continue;
		}
		dropped_by_daemon++;
		conn_drop(c);
		return false;
	}
	return c->fd >= 0;
}

/* --- building requests ----------------------------------------------------- */

/* A request being built: the frames go into out, sent in one write. */
static uint8_t out[4 * TD_FRAME_MAX_REQUEST];
static size_t out_len;

static void emit(struct conn *c, Tensord__Request *req)
{
	size_t n = tensord__request__get_packed_size(req);
	uint8_t *p;

	if (out_len + TD_FRAME_HEADER + n > sizeof(out))
		return;
	p = out + out_len;
	tensord__request__pack(req, p + TD_FRAME_HEADER);
	td_frame_header(p, (uint32_t)n, 0);
	if (chance(2)) {
		/* A corrupted frame: flipped bytes, a wrong length or version. */
		corrupted++;
		switch (below(4)) {
		case 0:
			for (int i = 0; i < 3; i++)
				p[below(TD_FRAME_HEADER + n)] ^= (uint8_t)(1u << below(8));
			break;
		case 1:
			if (n > 1)
				td_frame_header(p, (uint32_t)(n - 1 - below(n - 1)), 0);
			break;
		case 2:
			p[4] = (uint8_t)rnd();
			break;
		default:
			p[TD_FRAME_HEADER + below(n ? n : 1)] = (uint8_t)rnd();
			break;
		}
	}
	out_len += TD_FRAME_HEADER + n;
	if (req->body_case < 32) {
		sent[req->body_case]++;
		c->kind_of[req->id % 4096] = (uint8_t)req->body_case;
	}
	n_requests++;
}

static bool flush_out(struct conn *c, int pass_fd)
{
	bool ok = send_buf(c, out, out_len, pass_fd);

	out_len = 0;
	return ok;
}

static uint64_t new_id(struct conn *c)
{
	if (chance(2))
		return below(3) ? c->next_id - 1 : rnd(); /* reused or arbitrary ids */
	return c->next_id++;
}

static const char *const prefixes[] = { "f/", "f/a/", "p/", "g/", "" };

/* A name: learnt, or fresh in a small space (so they meet), or a bad one. */
static const char *pick_name(char *buf, size_t cap)
{
	static const char *const bad[] = { "",   "/",    "f//a", "f/",   "@nodeb/x", "a\xff",
					   "..", "f/\n", "@",    "@@/x", " f/a" };

	if (chance(4))
		return bad[below(sizeof(bad) / sizeof(bad[0]))];
	if (chance(1)) {
		size_t n = 200 + below(120);

		memset(buf, 'x', n < cap ? n : cap - 1);
		buf[n < cap ? n : cap - 1] = 0;
		return buf;
	}
	if (n_names && chance(55))
		return names[below(n_names)];
	snprintf(buf, cap, "%s%c%s", prefixes[below(4)], (char)('a' + below(6)),
		 chance(30) ? "1" : "");
	return buf;
}

static const char *pick_prefix(void)
{
	static const char *const odd[] = { "f", "@nodeb/", "f/a/b/", "/", "zz/" };

	if (chance(8))
		return odd[below(sizeof(odd) / sizeof(odd[0]))];
	return prefixes[below(5)];
}

static int64_t pick_timeout(void)
{
	switch (below(10)) {
	case 0:
	case 1:
	case 2:
	case 3:
		return 0;
	case 4:
	case 5:
		return (int64_t)(1 + below(50));
	case 6:
	case 7:
		return 10000;
	case 8:
		return -1;
	default:
		return (int64_t)rnd();
	}
}

struct create_buf {
	Tensord__Create m;
	Tensord__DType dt;
	Tensord__Device dev;
	int64_t shape[40], strides[40];
	char name[400];
	uint64_t nbytes; /* when the shape is sane */
};

static void make_create(struct create_buf *b, const char *name, bool for_put)
{
	static const uint32_t dts[][3] = {
		{ 2, 32, 1 }, { 1, 8, 1 }, { 0, 64, 1 }, { 6, 8, 1 }, { 4, 16, 1 }
	};
	unsigned k = (unsigned)below(5);
	uint64_t elems = 1;

	b->m = (Tensord__Create)TENSORD__CREATE__INIT;
	b->dt = (Tensord__DType)TENSORD__DTYPE__INIT;
	b->dev = (Tensord__Device)TENSORD__DEVICE__INIT;
	b->m.name = (char *)(name ? name : pick_name(b->name, sizeof(b->name)));
	b->dt.code = dts[k][0];
	b->dt.bits = dts[k][1];
	b->dt.lanes = dts[k][2];
	if (chance(4)) {
		b->dt.code = (uint32_t)below(20);
		b->dt.bits = chance(50) ? (uint32_t)below(300) : (uint32_t)rnd();
		b->dt.lanes = (uint32_t)below(4);
	}
	b->m.dtype = chance(2) ? NULL : &b->dt;
	b->m.n_shape = below(4);
	if (chance(3))
		b->m.n_shape = below(40);
	for (size_t i = 0; i < b->m.n_shape; i++) {
		b->shape[i] = (int64_t)(1 + below(for_put ? 64 : 128));
		if (chance(5))
			b->shape[i] = chance(50) ? 0 : (int64_t)rnd();
		elems *= (uint64_t)(b->shape[i] > 0 ? b->shape[i] : 0);
	}
	b->m.shape = b->shape;
	b->nbytes = elems * (b->dt.bits / 8 ? b->dt.bits / 8 : 1) * (b->dt.lanes ? b->dt.lanes : 1);
	if (elems > (1u << 24))
		b->nbytes = UINT64_MAX;
	if (!for_put && chance(6)) {
		b->m.n_strides = chance(80) ? b->m.n_shape : below(5);
		for (size_t i = 0; i < b->m.n_strides; i++)
			b->strides[i] = chance(80) ? (int64_t)below(600) : (int64_t)rnd();
		b->m.strides = b->strides;
	}
	b->dev.type = 1;
	if (chance(3)) {
		static const uint32_t types[] = { 2, 10, 3, 999 };

		b->dev.type = types[below(4)];
		b->dev.id = (int32_t)below(3) - 1;
	}
	b->m.device = chance(10) ? NULL : &b->dev;
	b->m.flags = (uint32_t)below(4);
	if (chance(3))
		b->m.flags = (uint32_t)rnd();
	static const uint32_t modes[] = { 0, 0600, 0644, 0666, 0400 };
	b->m.mode = chance(4) ? (uint32_t)rnd() : modes[below(5)];
	b->m.replace = chance(15);
	if (!for_put && chance(15))
		b->m.reserve = pool_pick(&reserves);
	/* Recycled memory (docs/recycle.md): ring buffers cycle under the rest. */
	b->m.recycle = chance(40);
}

static void park(struct conn *c, uint64_t id)
{
	c->parked[c->n_parked % PENDING] = id;
	if (c->n_parked < PENDING * 2)
		c->n_parked++;
}

static uint64_t parked_id(struct conn *c)
{
	if (!c->n_parked || chance(10))
		return chance(50) ? c->next_id + below(3) : rnd();
	return c->parked[below(c->n_parked < PENDING ? c->n_parked : PENDING)];
}

static uint32_t pick_tx(struct conn *c)
{
	if (c->n_txs && chance(80))
		return c->txs[below(c->n_txs)];
	if (chance(5))
		return (uint32_t)rnd();
	return (uint32_t)(1 + below(4));
}

static void note_tx(struct conn *c, uint32_t tx)
{
	if (c->n_txs < 8)
		c->txs[c->n_txs++] = tx;
	else
		c->txs[below(8)] = tx;
}

enum {
	K_HELLO,
	K_CREATE,
	K_PUBLISH,
	K_ATTACH,
	K_RELEASE,
	K_UNLINK,
	K_STAT,
	K_LIST,
	K_STATS,
	K_PUT,
	K_COMMIT,
	K_ABORT,
	K_ATTACH_MANY,
	K_CANCEL,
	K_WATCH,
	K_UNWATCH,
	K_LEASE_LIST,
	K_CLIENT_LIST,
	K_METRICS,
	K_RESERVE,
	K_UNRESERVE,
	K_BIND_PAGE,
	K_PEER_LIST,
	K_TX_CREATE,
	K_TX_UNLINK,
	K_RESOLVE,
	K_READOPT,
	K_KINDS
};

/* Appends one request of kind k (mutated) to out; name NULL: one is picked. */
static void one(struct conn *c, unsigned k, const char *name)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	struct create_buf cb;
	char nb[400];
	uint64_t shares[4];
	char *many[5];
	char many_buf[5][400];
	static uint8_t data[70000];
	union {
		Tensord__Hello hello;
		Tensord__Publish publish;
		Tensord__Attach attach;
		Tensord__Release release;
		Tensord__Unlink unlink;
		Tensord__Stat stat;
		Tensord__List list;
		Tensord__Stats stats;
		Tensord__Put put;
		Tensord__Commit commit;
		Tensord__Abort abort;
		Tensord__AttachMany attach_many;
		Tensord__Cancel cancel;
		Tensord__Watch watch;
		Tensord__Unwatch unwatch;
		Tensord__LeaseList lease_list;
		Tensord__ClientList client_list;
		Tensord__Metrics metrics;
		Tensord__Reserve reserve;
		Tensord__Unreserve unreserve;
		Tensord__BindPage bind_page;
		Tensord__PeerList peer_list;
		Tensord__Resolve resolve;
		Tensord__Readopt readopt;
	} m;
	Tensord__ReadoptLease ro[5], *pro[5];

	if (!name)
		name = pick_name(nb, sizeof(nb));
	req.id = new_id(c);
	switch (k) {
	case K_HELLO:
		m.hello = (Tensord__Hello)TENSORD__HELLO__INIT;
		/* The opening hello is rarely wrong: a wrong one ends the connection. */
		m.hello.version = chance(c->next_id == 1 ? 98 : 80) ? TENSORD_PROTOCOL_VERSION
								    : (uint32_t)rnd();
		m.hello.client = (char *)"reqfuzz";
		/* Tokens from a few, so that Resolves find what seqs did. */
		if (chance(70))
			m.hello.token = 1 + below(8);
		req.body_case = TENSORD__REQUEST__BODY_HELLO;
		req.hello = &m.hello;
		break;
	case K_CREATE:
	case K_TX_CREATE:
		make_create(&cb, name, false);
		if (k == K_TX_CREATE) {
			cb.m.tx = pick_tx(c);
			note_tx(c, cb.m.tx);
			/* Sets in one allocation: arenas opened, filled, overfilled, absurd. */
			if (chance(20))
				cb.m.arena_size = chance(80) ? (1 + below(64)) << 16 : rnd();
			else if (chance(40))
				cb.m.in_arena = true;
		}
		req.body_case = TENSORD__REQUEST__BODY_CREATE;
		req.create = &cb.m;
		break;
	case K_PUBLISH:
		m.publish = (Tensord__Publish)TENSORD__PUBLISH__INIT;
		m.publish.name = (char *)name;
		req.body_case = TENSORD__REQUEST__BODY_PUBLISH;
		req.publish = &m.publish;
		break;
	case K_ATTACH:
		m.attach = (Tensord__Attach)TENSORD__ATTACH__INIT;
		m.attach.name = (char *)name;
		m.attach.timeout_ms = pick_timeout();
		if (chance(20))
			m.attach.have_id = pool_pick(&tensor_ids);
		if (chance(20)) {
			m.attach.n_have_shares = 1 + below(3);
			for (size_t i = 0; i < m.attach.n_have_shares; i++)
				shares[i] = pool_pick(&share_ids);
			m.attach.have_shares = shares;
		}
		if (chance(30))
			m.attach.after = pool_pick(&gens) + below(2);
		m.attach.bind = chance(30);
		req.body_case = TENSORD__REQUEST__BODY_ATTACH;
		req.attach = &m.attach;
		if (m.attach.timeout_ms)
			park(c, req.id);
		break;
	case K_RELEASE:
		m.release = (Tensord__Release)TENSORD__RELEASE__INIT;
		m.release.lease = pool_pick(&leases);
		/* A fork while holding leases: every one of them tainted. */
		if (chance(2)) {
			m.release.lease = chance(80) ? 0 : m.release.lease;
			m.release.forked = true;
		}
		req.id = chance(90) ? 0 : req.id;
		req.body_case = TENSORD__REQUEST__BODY_RELEASE;
		req.release = &m.release;
		break;
	case K_UNLINK:
	case K_TX_UNLINK:
		m.unlink = (Tensord__Unlink)TENSORD__UNLINK__INIT;
		m.unlink.name = (char *)name;
		if (k == K_TX_UNLINK) {
			m.unlink.tx = pick_tx(c);
			note_tx(c, m.unlink.tx);
		}
		req.body_case = TENSORD__REQUEST__BODY_UNLINK;
		req.unlink = &m.unlink;
		break;
	case K_STAT:
		m.stat = (Tensord__Stat)TENSORD__STAT__INIT;
		m.stat.name = (char *)name;
		req.body_case = TENSORD__REQUEST__BODY_STAT;
		req.stat = &m.stat;
		break;
	case K_LIST:
		m.list = (Tensord__List)TENSORD__LIST__INIT;
		m.list.prefix = (char *)pick_prefix();
		m.list.after = chance(30) ? (char *)name : (char *)"";
		m.list.limit = chance(70) ? (uint32_t)below(10) : (uint32_t)rnd();
		req.body_case = TENSORD__REQUEST__BODY_LIST;
		req.list = &m.list;
		break;
	case K_STATS:
		m.stats = (Tensord__Stats)TENSORD__STATS__INIT;
		m.stats.figures_only = chance(50);
		req.body_case = TENSORD__REQUEST__BODY_STATS;
		req.stats = &m.stats;
		break;
	case K_PUT:
		make_create(&cb, name, true);
		if (chance(30))
			cb.m.flags = TENSORD_LIFETIME_CONNECTION;
		m.put = (Tensord__Put)TENSORD__PUT__INIT;
		m.put.create = chance(2) ? NULL : &cb.m;
		if (chance(90))
			cb.m.n_strides = 0;
		cb.m.reserve = 0;
		m.put.data.len = cb.nbytes <= 65536 ? cb.nbytes : below(100);
		if (chance(5))
			m.put.data.len = below(70000);
		memset(data, (int)below(256), m.put.data.len);
		m.put.data.data = data;
		req.body_case = TENSORD__REQUEST__BODY_PUT;
		req.put = &m.put;
		break;
	case K_COMMIT:
		m.commit = (Tensord__Commit)TENSORD__COMMIT__INIT;
		m.commit.tx = pick_tx(c);
		req.body_case = TENSORD__REQUEST__BODY_COMMIT;
		req.commit = &m.commit;
		break;
	case K_ABORT:
		m.abort = (Tensord__Abort)TENSORD__ABORT__INIT;
		m.abort.tx = pick_tx(c);
		req.body_case = TENSORD__REQUEST__BODY_ABORT;
		req.abort = &m.abort;
		break;
	case K_ATTACH_MANY:
		m.attach_many = (Tensord__AttachMany)TENSORD__ATTACH_MANY__INIT;
		if (chance(50)) {
			m.attach_many.n_names = 1 + below(4);
			for (size_t i = 0; i < m.attach_many.n_names; i++)
				many[i] = (char *)(i ? pick_name(many_buf[i], sizeof(many_buf[i]))
						     : name);
			m.attach_many.names = many;
		} else {
			m.attach_many.prefix = (char *)pick_prefix();
		}
		if (chance(40))
			m.attach_many.after = pool_pick(&commits) + below(2);
		m.attach_many.timeout_ms = pick_timeout();
		if (chance(20)) {
			m.attach_many.n_have_shares = 1 + below(3);
			for (size_t i = 0; i < m.attach_many.n_have_shares; i++)
				shares[i] = pool_pick(&share_ids);
			m.attach_many.have_shares = shares;
		}
		req.body_case = TENSORD__REQUEST__BODY_ATTACH_MANY;
		req.attach_many = &m.attach_many;
		if (m.attach_many.timeout_ms)
			park(c, req.id);
		break;
	case K_CANCEL:
		m.cancel = (Tensord__Cancel)TENSORD__CANCEL__INIT;
		m.cancel.id = parked_id(c);
		req.body_case = TENSORD__REQUEST__BODY_CANCEL;
		req.cancel = &m.cancel;
		break;
	case K_WATCH:
		m.watch = (Tensord__Watch)TENSORD__WATCH__INIT;
		m.watch.prefix = (char *)pick_prefix();
		m.watch.after = chance(50) ? pool_pick(&commits) : 0;
		/* Queues stay small: a big one is issue 30's item 5, not this fuzzer's. */
		m.watch.queue = chance(90) ? (uint32_t)below(8) : (uint32_t)below(300);
		m.watch.replay = chance(60);
		req.body_case = TENSORD__REQUEST__BODY_WATCH;
		req.watch = &m.watch;
		park(c, req.id);
		break;
	case K_UNWATCH:
		m.unwatch = (Tensord__Unwatch)TENSORD__UNWATCH__INIT;
		m.unwatch.id = parked_id(c);
		req.body_case = TENSORD__REQUEST__BODY_UNWATCH;
		req.unwatch = &m.unwatch;
		break;
	case K_LEASE_LIST:
		m.lease_list = (Tensord__LeaseList)TENSORD__LEASE_LIST__INIT;
		m.lease_list.name = chance(50) ? (char *)name : (char *)"";
		m.lease_list.after_conn = chance(50) ? pool_pick(&conn_ids) : 0;
		m.lease_list.after_slot = chance(70) ? (uint32_t)below(5) : (uint32_t)rnd();
		m.lease_list.limit = chance(70) ? (uint32_t)below(5) : (uint32_t)rnd();
		m.lease_list.after_tensor = chance(10) ? rnd() : 0;
		req.body_case = TENSORD__REQUEST__BODY_LEASE_LIST;
		req.lease_list = &m.lease_list;
		break;
	case K_CLIENT_LIST:
		m.client_list = (Tensord__ClientList)TENSORD__CLIENT_LIST__INIT;
		m.client_list.after = chance(50) ? pool_pick(&conn_ids) : 0;
		m.client_list.limit = chance(70) ? (uint32_t)below(5) : (uint32_t)rnd();
		req.body_case = TENSORD__REQUEST__BODY_CLIENT_LIST;
		req.client_list = &m.client_list;
		break;
	case K_METRICS:
		m.metrics = (Tensord__Metrics)TENSORD__METRICS__INIT;
		req.body_case = TENSORD__REQUEST__BODY_METRICS;
		req.metrics = &m.metrics;
		break;
	case K_RESERVE:
		m.reserve = (Tensord__Reserve)TENSORD__RESERVE__INIT;
		/* Mostly one size class, which the pool then keeps warm. */
		m.reserve.size = (chance(70) ? 1 : 1 + below(4)) << 20;
		if (chance(10))
			m.reserve.size = chance(50) ? below(1 << 20) : rnd();
		req.body_case = TENSORD__REQUEST__BODY_RESERVE;
		req.reserve = &m.reserve;
		break;
	case K_UNRESERVE:
		m.unreserve = (Tensord__Unreserve)TENSORD__UNRESERVE__INIT;
		m.unreserve.id = pool_pick(&reserves);
		req.id = chance(90) ? 0 : req.id;
		req.body_case = TENSORD__REQUEST__BODY_UNRESERVE;
		req.unreserve = &m.unreserve;
		break;
	case K_BIND_PAGE:
		m.bind_page = (Tensord__BindPage)TENSORD__BIND_PAGE__INIT;
		req.body_case = TENSORD__REQUEST__BODY_BIND_PAGE;
		req.bind_page = &m.bind_page;
		break;
	case K_RESOLVE:
		m.resolve = (Tensord__Resolve)TENSORD__RESOLVE__INIT;
		m.resolve.token = chance(80) ? 1 + below(8) : rnd();
		m.resolve.seq = chance(90) ? below(80) : rnd();
		m.resolve.instance = chance(50) ? 0 : rnd();
		req.body_case = TENSORD__REQUEST__BODY_RESOLVE;
		req.resolve = &m.resolve;
		break;
	case K_READOPT:
		/* Leases of versions this connection may or may not have held. */
		m.readopt = (Tensord__Readopt)TENSORD__READOPT__INIT;
		m.readopt.n_leases = below(6);
		for (size_t i = 0; i < m.readopt.n_leases; i++) {
			tensord__readopt_lease__init(&ro[i]);
			ro[i].name =
				(char *)(i ? pick_name(many_buf[i - 1], sizeof(many_buf[i - 1]))
					   : name);
			ro[i].generation = chance(80) ? below(8) : rnd();
			pro[i] = &ro[i];
		}
		m.readopt.leases = pro;
		req.body_case = TENSORD__REQUEST__BODY_READOPT;
		req.readopt = &m.readopt;
		break;
	default:
		m.peer_list = (Tensord__PeerList)TENSORD__PEER_LIST__INIT;
		req.body_case = TENSORD__REQUEST__BODY_PEER_LIST;
		req.peer_list = &m.peer_list;
		break;
	}
	/* A seq on any request: the daemon remembers what effecting ones did. */
	if (chance(60))
		req.seq = chance(95) ? 1 + below(64) : rnd();
	if (chance(1))
		req.body_case = TENSORD__REQUEST__BODY__NOT_SET; /* an empty request */
	emit(c, &req);
}

/* --- what it does ----------------------------------------------------------- */

static struct conn *open_conn(struct conn *c)
{
	int fd = dial();

	if (fd < 0) {
		if (fd == -ECONNREFUSED || fd == -ENOENT)
			note_gone(-fd);
		return NULL;
	}
	c->fd = fd;
	c->next_id = 1;
	c->in_len = c->n_parked = c->n_txs = 0;
	if (chance(97))
		one(c, K_HELLO, NULL);
	return c;
}

static struct conn *any_conn(void)
{
	struct conn *c = &conns[below(n_conns)];

	if (c->fd < 0 && !open_conn(c))
		return NULL;
	return c;
}

/* Closes c now, maybe after sending what is in out; counts it as abrupt. */
static void slam(struct conn *c)
{
	if (out_len)
		flush_out(c, -1);
	if (c->fd >= 0) {
		abrupt++;
		if (chance(20))
			shutdown(c->fd, SHUT_RDWR);
		conn_drop(c);
	}
}

/*
 * Sequences whose replies the daemon sends from inside a commit, each ended
 * (most of the time) by closing the connection before it reads them.
 */
static void scenario(void)
{
	struct conn *c = any_conn(), *d;
	char nb[400];
	const char *name = pick_name(nb, sizeof(nb));
	bool close_now = chance(75);

	if (!c)
		return;
	drain(c, 0);
	switch (below(7)) {
	case 0: /* a waiter on this connection, woken by its own put or publish */
		one(c, K_ATTACH, name);
		if (chance(50)) {
			one(c, K_PUT, name);
		} else {
			one(c, K_CREATE, name);
			one(c, K_PUBLISH, name);
		}
		break;
	case 1: /* a watch's replay and flush */
		one(c, K_PUT, name);
		one(c, K_WATCH, NULL);
		break;
	case 2: /* watchers of a prefix that close while another connection puts there */
		for (int i = 0; i < 3; i++) {
			d = any_conn();
			if (d && d != c) {
				drain(d, 0);
				one(d, K_WATCH, NULL);
				if (!flush_out(d, -1))
					continue;
				if (chance(50))
					slam(d);
			}
		}
		one(c, K_PUT, name);
		break;
	case 3: /* a connection-lifetime tensor: its unlink commits as the connection ends */
		one(c, K_WATCH, NULL);
		one(c, K_PUT, name);
		one(c, K_ATTACH_MANY, NULL);
		break;
	case 4: /* a transaction, committed with waiters and watchers around */
		one(c, K_ATTACH_MANY, NULL);
		for (int i = 0, n = 1 + (int)below(4); i < n; i++)
			one(c, chance(80) ? K_TX_CREATE : K_TX_UNLINK, NULL);
		one(c, K_COMMIT, NULL);
		break;
	case 5: /* a flood of attaches whose descriptors pile up past the in-flight bound */
		for (int i = 0, n = 10 + (int)below(70); i < n; i++)
			one(c, chance(80) ? K_ATTACH : K_ATTACH_MANY, chance(90) ? name : NULL);
		break;
	default: /* a burst of anything */
		for (int i = 0, n = 2 + (int)below(8); i < n; i++)
			one(c, (unsigned)below(K_KINDS), NULL);
		break;
	}
	if (!flush_out(c, -1))
		return;
	if (close_now) {
		slam(c);
	} else if (chance(10)) {
		/* Half closed: the daemon reads EOF with replies still to send. */
		shutdown(c->fd, SHUT_WR);
		drain(c, 5);
		abrupt++;
		conn_drop(c);
	} else {
		drain(c, chance(50) ? 1 : 0);
	}
}

/* Something hostile with a descriptor the daemon handed out. */
static void fd_op(void)
{
	unsigned i;
	int fd;
	struct stat st;
	uint8_t junk[256];

	if (!n_fds)
		return;
	i = (unsigned)below(n_fds);
	fd = fds[i];
	fd_ops++;
	if (fstat(fd, &st) < 0)
		st.st_size = 0;
	memset(junk, (int)below(256), sizeof(junk));
	switch (below(7)) {
	case 0:
		(void)!pwrite(fd, junk, 1 + below(sizeof(junk)),
			      (off_t)(st.st_size ? below((uint64_t)st.st_size) : 0));
		break;
	case 1: {
		off_t sizes[] = { 0, st.st_size / 2, st.st_size * 2, st.st_size + 4096, 1 };

		(void)!ftruncate(fd, sizes[below(5)]);
		break;
	}
	case 2:
		(void)!fcntl(fd, F_ADD_SEALS, (int)below(32));
		break;
	case 3:
	case 4:
		if (st.st_size > 0 && (uint64_t)st.st_size <= FD_BYTES_MAX / 8) {
			void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED,
				       fd, 0);
			volatile uint8_t sum = 0;

			if (p == MAP_FAILED)
				p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
			else
				memset(p, (int)below(256), (size_t)below((uint64_t)st.st_size) + 1);
			if (p != MAP_FAILED) {
				sum += ((uint8_t *)p)[st.st_size - 1];
				munmap(p, (size_t)st.st_size);
			}
		}
		break;
	case 5: {
		/* Back to the daemon, riding with a request (clients never send descriptors). */
		struct conn *c = any_conn();

		if (c) {
			passed_back++;
			one(c, (unsigned)below(K_KINDS), NULL);
			if (chance(50))
				td_frame_header(out, (uint32_t)(out_len - TD_FRAME_HEADER), 1);
			flush_out(c, fd);
		}
		break;
	}
	default:
		close(fd);
		fds[i] = fds[--n_fds];
		break;
	}
}

static void step(void)
{
	unsigned r = (unsigned)below(100);
	struct conn *c;

	if (r < 35) {
		scenario();
	} else if (r < 80) {
		c = any_conn();
		if (!c)
			return;
		drain(c, 0);
		for (int i = 0, n = chance(30) ? 2 + (int)below(5) : 1; i < n; i++)
			one(c, (unsigned)below(K_KINDS), NULL);
		if (flush_out(c, -1) && chance(10))
			slam(c);
	} else if (r < 88) {
		c = &conns[below(n_conns)];
		drain(c, chance(30) ? 2 : 0);
	} else if (r < 96) {
		fd_op();
	} else {
		c = &conns[below(n_conns)];
		if (c->fd >= 0)
			slam(c);
	}
}

/* --- the final check ------------------------------------------------------- */

/* Sends req on a fresh blocking connection and waits for the reply of id. */
static int call(int fd, Tensord__Request *req, Tensord__Reply **ret)
{
	uint8_t buf[4096], in[1 << 16];
	size_t n = tensord__request__get_packed_size(req), have = 0;

	if (n + TD_FRAME_HEADER > sizeof(buf))
		return -EMSGSIZE;
	tensord__request__pack(req, buf + TD_FRAME_HEADER);
	td_frame_header(buf, (uint32_t)n, 0);
	if (send(fd, buf, n + TD_FRAME_HEADER, MSG_NOSIGNAL) != (ssize_t)(n + TD_FRAME_HEADER))
		return -errno;
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		struct td_frame f;
		long k;
		ssize_t got;
		Tensord__Reply *r;

		k = td_frame_parse(in, have, sizeof(in), TD_FRAME_FDS_COUNTABLE, &f);
		if (k < 0)
			return (int)k;
		if (k > 0) {
			r = tensord__reply__unpack(NULL, f.len, f.payload);
			memmove(in, in + k, have - (size_t)k);
			have -= (size_t)k;
			if (!r)
				return -EBADMSG;
			if (r->id == req->id) {
				*ret = r;
				return 0;
			}
			tensord__reply__free_unpacked(r, NULL);
			continue;
		}
		if (poll(&p, 1, 10000) <= 0)
			return -ETIMEDOUT;
		got = recv(fd, in + have, sizeof(in) - have, 0); /* descriptors are dropped */
		if (got <= 0)
			return got < 0 ? -errno : -ECONNRESET;
		have += (size_t)got;
	}
}

static int final_check(void)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Hello h = TENSORD__HELLO__INIT;
	Tensord__Put put = TENSORD__PUT__INIT;
	Tensord__Create cr = TENSORD__CREATE__INIT;
	Tensord__DType dt = TENSORD__DTYPE__INIT;
	Tensord__Device dev = TENSORD__DEVICE__INIT;
	Tensord__Attach at = TENSORD__ATTACH__INIT;
	Tensord__Stats st = TENSORD__STATS__INIT;
	Tensord__Reply *r = NULL;
	int64_t shape[1] = { 4 };
	uint8_t bytes[16] = { 1, 2, 3, 4 };
	char name[64];
	int fd = dial(), e;

	if (fd < 0) {
		fprintf(stderr, "reqfuzz: FAIL: the daemon does not accept: connect %s: %s\n",
			sock_path, strerror(-fd));
		return -1;
	}
	snprintf(name, sizeof(name), "reqfuzz/final-%d", (int)getpid());
	h.version = TENSORD_PROTOCOL_VERSION;
	h.client = (char *)"reqfuzz final";
	req.id = 1;
	req.body_case = TENSORD__REQUEST__BODY_HELLO;
	req.hello = &h;
	if ((e = call(fd, &req, &r)) < 0 || r->status != 0)
		goto bad;
	tensord__reply__free_unpacked(r, NULL);
	dt.code = 2;
	dt.bits = 32;
	dt.lanes = 1;
	dev.type = 1;
	cr.name = name;
	cr.dtype = &dt;
	cr.n_shape = 1;
	cr.shape = shape;
	cr.device = &dev;
	put.create = &cr;
	put.data.len = sizeof(bytes);
	put.data.data = bytes;
	req.id = 2;
	req.body_case = TENSORD__REQUEST__BODY_PUT;
	req.put = &put;
	if ((e = call(fd, &req, &r)) < 0 || r->status != 0)
		goto bad;
	tensord__reply__free_unpacked(r, NULL);
	at.name = name;
	req.id = 3;
	req.body_case = TENSORD__REQUEST__BODY_ATTACH;
	req.attach = &at;
	if ((e = call(fd, &req, &r)) < 0 || r->status != 0 || !r->lease ||
	    r->lease->info->nbytes != sizeof(bytes))
		goto bad;
	tensord__reply__free_unpacked(r, NULL);
	req.id = 4;
	req.body_case = TENSORD__REQUEST__BODY_STATS;
	req.stats = &st;
	if ((e = call(fd, &req, &r)) < 0 || r->status != 0 || !r->stats)
		goto bad;
	printf("reqfuzz: the daemon answers: %" PRIu64 " tensors, %" PRIu64 " clients, %" PRIu64
	       " leases\n",
	       r->stats->tensors, r->stats->clients, r->stats->leases);
	tensord__reply__free_unpacked(r, NULL);
	close(fd);
	return 0;
bad:
	if (e < 0)
		fprintf(stderr,
			"reqfuzz: FAIL: the daemon does not answer request %" PRIu64 ": %s\n",
			req.id, strerror(-e));
	else
		fprintf(stderr, "reqfuzz: FAIL: request %" PRIu64 " answered %d: %s\n", req.id,
			r->status, r->message);
	if (r)
		tensord__reply__free_unpacked(r, NULL);
	close(fd);
	return -1;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: reqfuzz --socket PATH [--seed N] [--seconds S] [--count N] "
		"[--conns K (1-%d)] [--verbose]\n",
		CONNS_MAX);
	exit(1);
}

int main(int argc, char **argv)
{
	static const char *const kind_names[32] = {
		[2] = "hello",        [3] = "create",       [4] = "publish",    [5] = "attach",
		[6] = "release",      [7] = "unlink",       [8] = "stat",       [9] = "list",
		[10] = "stats",       [11] = "put",         [12] = "commit",    [13] = "abort",
		[14] = "attach_many", [15] = "cancel",      [16] = "watch",     [17] = "unwatch",
		[20] = "lease_list",  [21] = "client_list", [22] = "metrics",   [23] = "reserve",
		[24] = "unreserve",   [25] = "bind_page",   [26] = "peer_list", [27] = "readopt",
		[28] = "resolve",     [0] = "empty",
	};
	uint64_t seed = 0, count = 0;
	double seconds = 10, end, next_report;
	bool have_seed = false;
	int rc;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--verbose")) {
			verbose = true;
			continue;
		}
		if (!v)
			usage();
		i++;
		if (!strcmp(a, "--socket"))
			sock_path = v;
		else if (!strcmp(a, "--seed"))
			seed = strtoull(v, NULL, 0), have_seed = true;
		else if (!strcmp(a, "--seconds"))
			seconds = strtod(v, NULL);
		else if (!strcmp(a, "--count"))
			count = strtoull(v, NULL, 0);
		else if (!strcmp(a, "--conns"))
			n_conns = (unsigned)strtoul(v, NULL, 0);
		else
			usage();
	}
	if (!sock_path || n_conns < 1 || n_conns > CONNS_MAX)
		usage();
	if (!have_seed) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
	}
	rng_state = seed;
	signal(SIGPIPE, SIG_IGN);
	printf("reqfuzz: seed %" PRIu64 " (--seed %" PRIu64 " --seconds %g%s), %u connections\n",
	       seed, seed, seconds, count ? " --count set" : "", n_conns);
	fflush(stdout);
	for (unsigned i = 0; i < CONNS_MAX; i++)
		conns[i].fd = -1;
	t_start = now();
	end = t_start + seconds;
	next_report = t_start + 1;
	while (now() < end && (!count || n_requests < count)) {
		step();
		if (gone_at >= 0)
			break;
		if (verbose && now() > next_report) {
			next_report += 1;
			fprintf(stderr,
				"reqfuzz: %.0f s: %" PRIu64 " requests, %" PRIu64 " replies\n",
				now() - t_start, n_requests, replies);
		}
	}
	for (unsigned i = 0; i < CONNS_MAX; i++)
		conn_drop(&conns[i]);
	for (unsigned i = 0; i < n_fds; i++)
		close(fds[i]);
	printf("reqfuzz: %" PRIu64 " requests in %.1f s, %" PRIu64 " replies, %" PRIu64
	       " connections closed abruptly, %" PRIu64 " closed by the daemon, %" PRIu64
	       " corrupted frames, %" PRIu64 " descriptors received, %" PRIu64
	       " hostile uses of them (%" PRIu64 " sent back)\n",
	       n_requests, now() - t_start, replies, abrupt, dropped_by_daemon, corrupted, fds_got,
	       fd_ops, passed_back);
	printf("reqfuzz: sent:");
	for (unsigned i = 0; i < 32; i++)
		if (sent[i])
			printf(" %s %" PRIu64, kind_names[i] ? kind_names[i] : "?", sent[i]);
	printf("\nreqfuzz: answered ok:");
	for (unsigned i = 0; i < 32; i++)
		if (ok_by_kind[i])
			printf(" %s %" PRIu64, kind_names[i] ? kind_names[i] : "?", ok_by_kind[i]);
	printf("\nreqfuzz: answered:");
	for (unsigned i = 0; i < 256; i++)
		if (statuses[i])
			printf(" %s %" PRIu64,
			       i ? strerrorname_np((int)i) ? strerrorname_np((int)i) : "?" : "ok",
			       statuses[i]);
	printf("\n");
	fflush(stdout);
	rc = final_check();
	if (gone_at >= 0)
		fprintf(stderr,
			"reqfuzz: FAIL: seed %" PRIu64 ": the daemon stopped answering %.2f s in, "
			"after %" PRIu64 " requests (its log has the reason)\n",
			seed, gone_at, gone_after);
	return rc < 0 || gone_at >= 0 ? 2 : 0;
}
