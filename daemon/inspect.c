/*
 * Inspection: LeaseList and ClientList. Nothing here is on the hot path:
 * the answers are computed when asked, by walking the live connections and
 * their lease ledgers, so attach and release pay only for the one
 * timestamp each lease keeps (reg_lease.since_ns).
 *
 * Times are kept on the monotonic clock (a lease's start, a connection's
 * accept) and turned into CLOCK_REALTIME dates when a reply is built, so a
 * clock step moves the dates shown but never the durations.
 */
#include "inspect.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/desc.h"
#include "metrics.h"
#include "reply.h"
#include "server.h"

static uint64_t wall_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Both clocks read once per reply. */
struct clocks {
	uint64_t mono, wall;
};

static struct clocks clocks_now(void)
{
	return (struct clocks){ now_ns(), wall_ns() };
}

static uint64_t ago(const struct clocks *k, uint64_t mono)
{
	return k->mono > mono ? k->mono - mono : 0;
}

/* The CLOCK_REALTIME date of a monotonic time. */
static uint64_t wall_of(const struct clocks *k, uint64_t mono)
{
	uint64_t d = ago(k, mono);

	return k->wall > d ? k->wall - d : 0;
}

/* Text from a peer or /proc goes into protobuf strings: printable ASCII only. */
static void make_printable(char *s)
{
	for (; *s; s++)
		if (*s < 0x20 || *s > 0x7e)
			*s = '?';
}

void inspect_client_opened(struct client *cl)
{
	char path[32];
	ssize_t n;
	int fd;

	cl->connected_ns = now_ns();
	/* pid 0: the peer is in a pid namespace we cannot see into. */
	if (!cl->rc.pid)
		return;
	snprintf(path, sizeof(path), "/proc/%u/comm", cl->rc.pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	n = read(fd, cl->comm, sizeof(cl->comm) - 1);
	close(fd);
	cl->comm[n > 0 ? n : 0] = '\0';
	cl->comm[strcspn(cl->comm, "\n")] = '\0';
	make_printable(cl->comm);
}

void inspect_client_hello(struct client *cl, const char *text, const char *label)
{
	snprintf(cl->hello, sizeof(cl->hello), "%s", text ? text : "");
	make_printable(cl->hello);
	/* Checked by dispatch (td_label_check()): printable already. */
	snprintf(cl->label, sizeof(cl->label), "%s", label ? label : "");
}

/*
 * n reply entries of sz bytes each behind an array of n pointers to them,
 * in one allocation: free() the array. NULL when out of memory.
 */
static void *entry_array(size_t n, size_t sz)
{
	void **p = malloc(n * (sizeof(void *) + sz) + 1);
	char *e = (char *)(p + n);

	for (size_t i = 0; p && i < n; i++)
		p[i] = e + i * sz;
	return p;
}

static uint32_t page_limit(uint32_t asked)
{
	return asked && asked < INSPECT_PAGE_MAX ? asked : INSPECT_PAGE_MAX;
}

/* --- LeaseList ---------------------------------------------------------------- */

/*
 * A page walks the connections newest first (the order of srv->conns) and
 * each one's lease slots in order, from the cursor the request carries
 * (proto/tensord.proto, LeaseList), and stops after INSPECT_SCAN_MAX slots
 * or when a lease would need an entry past the page's limit. So a page
 * costs O(connections + INSPECT_SCAN_MAX) however many leases a client
 * holds, and allocates two arrays of the page's size. The leases of one
 * connection on one tensor within the page fold into one entry, found
 * through a small hash of the page's (connection, tensor) pairs. Nothing is
 * sorted: libtensord puts the pages together (client/lib/inspect.c).
 */

/* The leases one connection holds on one tensor, among the slots a page visited. */
struct holding {
	const struct tensor *t;  /* borrowed: a lease holds it */
	const struct client *cl; /* borrowed */
	uint64_t since;          /* CLOCK_MONOTONIC, the oldest lease's */
	uint64_t count;          /* summed in 64 bits, clamped once when sent */
};

struct lease_page {
	struct holding *v; /* limit entries */
	uint32_t *hash;    /* n_hash >= 2 * limit buckets: index + 1 into v; 0: empty */
	size_t n, limit, n_hash;
	/* What is done, the cursor: the connections newer than conn, and conn's
	 * first slot lease slots, or all of them when slot is 0. */
	uint64_t conn;
	uint32_t slot;
	bool more;
	uint64_t visits;
};

/* Whether a lease on t belongs in the answer to m for me. */
static bool lease_wanted(const struct tensor *t, const Tensord__LeaseList *m, size_t name_len,
			 const struct client *me)
{
	if (name_len && (t->name_len != name_len || memcmp(t->name, m->name, name_len) != 0))
		return false;
	return registry_may_inspect(t, &me->rc);
}

static size_t hash_of(const struct tensor *t, const struct client *cl, size_t n_hash)
{
	uint64_t k = (t->id ^ cl->conn->id << 40) * 0x9e3779b97f4a7c15ull;

	return (size_t)(k >> 32) & (n_hash - 1);
}

/*
 * Adds a lease of cl on t to the page: to their entry, or to a new one.
 * false when that needs an entry past the limit: the page ends before it.
 */
static bool page_add(struct lease_page *pg, const struct client *cl, const struct tensor *t,
		     uint64_t since, uint32_t weight)
{
	size_t b = hash_of(t, cl, pg->n_hash);
	struct holding *h;

	/* At most limit of the 2 * limit buckets are taken: a free one is near. */
	for (; pg->hash[b]; b = (b + 1) & (pg->n_hash - 1)) {
		h = &pg->v[pg->hash[b] - 1];
		if (h->t == t && h->cl == cl) {
			h->count += weight;
			if (since < h->since)
				h->since = since;
			return true;
		}
	}
	if (pg->n == pg->limit)
		return false;
	pg->v[pg->n] = (struct holding){ t, cl, since, weight };
	pg->hash[b] = (uint32_t)++pg->n;
	return true;
}

/* The first connection the cursor leaves to visit, and its first slot there. */
static struct conn *page_start(struct lease_page *pg, struct conn *c, uint32_t *ret_slot)
{
	*ret_slot = 0;
	if (!pg->conn)
		return c;
	/* Newest first: pass those newer than the cursor's connection. */
	for (; c && c->id > pg->conn; c = LIST_NEXT(c, link))
		pg->visits++;
	if (c && c->id == pg->conn) {
		if (pg->slot)
			*ret_slot = pg->slot;
		else
			c = LIST_NEXT(c, link);
	}
	return c;
}

/*
 * Walks on from the cursor until the page is full, INSPECT_SCAN_MAX slots
 * are visited, or every lease is seen; the cursor follows what is done.
 */
static void page_fill(struct lease_page *pg, const struct client *me, const Tensord__LeaseList *m)
{
	size_t name_len = strlen(m->name), budget = INSPECT_SCAN_MAX;
	uint32_t s;
	struct conn *c = page_start(pg, LIST_FIRST(&me->srv->conns.list), &s);

	for (; c; c = LIST_NEXT(c, link), s = 0) {
		const struct client *cl = conn_data(c);
		const struct reg_client *rc = &cl->rc;

		pg->visits++;
		for (; s < rc->n_slots; s++) {
			const struct tensor *t = rc->leases[s].t;

			if (!budget || (t && lease_wanted(t, m, name_len, me) &&
					!page_add(pg, cl, t, rc->leases[s].since_ns,
						  registry_lease_weight(rc, s)))) {
				pg->more = true;
				return;
			}
			budget--;
			pg->visits++;
			pg->conn = c->id;
			pg->slot = s + 1;
		}
		pg->conn = c->id;
		pg->slot = 0;
	}
}

static void fill_holder(Tensord__LeaseHolder *h, const struct holding *x, const struct clocks *k)
{
	tensord__lease_holder__init(h);
	h->name = x->t->name;
	h->tensor_id = x->t->id;
	h->state = (Tensord__State)x->t->state;
	h->conn_id = x->cl->conn->id;
	h->pid = x->cl->rc.pid;
	h->uid = x->cl->rc.uid;
	h->gid = x->cl->rc.gid;
	h->comm = (char *)x->cl->comm;
	/* A binding's weight is its client's word, clamped to INT32_MAX
	 * (registry_lease_weight()); a sum of many is clamped to the same. */
	h->count = x->count > INT32_MAX ? INT32_MAX : (uint32_t)x->count;
	h->since_ns = wall_of(k, x->since);
	h->held_ns = ago(k, x->since);
	h->label = (char *)x->cl->label;
	h->bytes = x->t->nbytes;
	h->commit = tensor_shown_commit(x->t);
}

static void send_holders(struct conn *c, uint64_t req_id, const struct lease_page *pg)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__LeaseListReply lr = TENSORD__LEASE_LIST_REPLY__INIT;
	Tensord__LeaseHolder **ph = entry_array(pg->n, sizeof(**ph));
	struct clocks k = clocks_now();

	if (!ph) {
		reply_status(c, TENSORD__REQUEST__BODY_LEASE_LIST, req_id, -ENOMEM,
			     "out of memory listing lease holders");
		return;
	}
	/* A binding no local lease uses (idle, docs/design.md "Attach without a
	 * round trip") holds no handle: it is not listed. */
	for (size_t i = 0; i < pg->n; i++)
		if (pg->v[i].count)
			fill_holder(ph[lr.n_holders++], &pg->v[i], &k);
	lr.holders = ph;
	lr.more = pg->more;
	lr.next_conn = pg->more ? pg->conn : 0;
	lr.next_slot = pg->more ? pg->slot : 0;
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_LEASE_LIST;
	rep.lease_list = &lr;
	conn_send(c, &rep.base, NULL);
	free(ph);
}

void inspect_leases(struct client *cl, uint64_t req_id, const Tensord__LeaseList *m)
{
	struct lease_page pg = { .limit = page_limit(m->limit),
				 .conn = m->after_conn,
				 .slot = m->after_slot };
	size_t len = strlen(m->name);
	char why[300];

	/* The one check of this name from a peer, as dispatch does for the others. */
	if (len && td_name_check(m->name, len, why, sizeof(why)) < 0) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_LEASE_LIST, req_id, -EINVAL, why);
		return;
	}
	for (pg.n_hash = 2; pg.n_hash < 2 * pg.limit;)
		pg.n_hash *= 2;
	pg.v = malloc(pg.limit * sizeof(*pg.v));
	pg.hash = calloc(pg.n_hash, sizeof(*pg.hash));
	if (pg.v && pg.hash) {
		page_fill(&pg, cl, m);
		metrics_visits(METRICS_VISITS_LEASE_LIST, pg.visits);
		send_holders(cl->conn, req_id, &pg);
	} else {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_LEASE_LIST, req_id, -ENOMEM,
			     "out of memory listing lease holders");
	}
	free(pg.hash);
	free(pg.v);
}

/* --- ClientList --------------------------------------------------------------- */

static int cmp_client(const void *a, const void *b)
{
	uint64_t x = (*(struct client *const *)a)->conn->id;
	uint64_t y = (*(struct client *const *)b)->conn->id;

	return x < y ? -1 : x > y;
}

static void fill_client(Tensord__ClientInfo *ci, const struct client *cl, const struct clocks *k)
{
	tensord__client_info__init(ci);
	ci->conn_id = cl->conn->id;
	ci->pid = cl->rc.pid;
	ci->uid = cl->rc.uid;
	ci->gid = cl->rc.gid;
	ci->comm = (char *)cl->comm;
	ci->client = (char *)cl->hello;
	ci->connected_ns = wall_of(k, cl->connected_ns);
	ci->leases = cl->rc.n_leases;
	ci->tensors_created = cl->rc.n_created;
	ci->waiters = cl->waits.n_waiters;
	ci->bytes_queued = cl->conn->out_bytes;
	ci->requests = cl->requests;
	ci->label = (char *)cl->label;
}

static void send_clients(struct conn *c, uint64_t req_id, struct client *const *v, size_t n,
			 bool more)
{
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__ClientListReply cr = TENSORD__CLIENT_LIST_REPLY__INIT;
	Tensord__ClientInfo **pci = entry_array(n, sizeof(**pci));
	struct clocks k = clocks_now();

	if (!pci) {
		reply_status(c, TENSORD__REQUEST__BODY_CLIENT_LIST, req_id, -ENOMEM,
			     "out of memory listing clients");
		return;
	}
	for (size_t i = 0; i < n; i++)
		fill_client(pci[i], v[i], &k);
	cr.n_clients = n;
	cr.clients = pci;
	cr.more = more;
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_CLIENT_LIST;
	rep.client_list = &cr;
	conn_send(c, &rep.base, NULL);
	free(pci);
}

void inspect_clients(struct client *cl, uint64_t req_id, const Tensord__ClientList *m)
{
	struct conn_set *set = &cl->srv->conns;
	struct client **v = malloc((set->n ? set->n : 1) * sizeof(*v));
	uint32_t limit = page_limit(m->limit);
	size_t n = 0;

	if (!v) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_CLIENT_LIST, req_id, -ENOMEM,
			     "out of memory listing clients");
		return;
	}
	for (struct conn *c = LIST_FIRST(&set->list); c && n < set->n; c = LIST_NEXT(c, link))
		if (c->id > m->after && (cl->rc.uid == 0 || c->uid == cl->rc.uid))
			v[n++] = conn_data(c);
	if (n)
		qsort(v, n, sizeof(*v), cmp_client);
	send_clients(cl->conn, req_id, v, n < limit ? n : limit, n > limit);
	free(v);
}

/* --- PeerList ------------------------------------------------------------------ */

/* The --peers-dns names into di, dp pointing at each, host holding their HOST:PORT; how many. */
static size_t peer_dns_info(const struct peer_set *set, Tensord__PeerDnsInfo *di,
			    Tensord__PeerDnsInfo **dp, char (*host)[PEER_ADDR_MAX])
{
	for (unsigned i = 0; i < set->n_dns; i++) {
		const struct peer_dns *d = &set->dns[i];
		Tensord__PeerDnsInfo *w = &di[i];

		tensord__peer_dns_info__init(w);
		snprintf(host[i], PEER_ADDR_MAX, "%s%.253s%s:%u", strchr(d->host, ':') ? "[" : "",
			 d->host, strchr(d->host, ':') ? "]" : "", d->port);
		w->host = host[i];
		w->addresses = d->n_addrs;
		for (unsigned j = 0; j < set->n_targets; j++)
			w->self += set->targets[j]->dns == d && set->targets[j]->self;
		w->resolutions = d->resolutions;
		w->failures = d->failures;
		w->error = (char *)d->error;
		dp[i] = w;
	}
	return set->n_dns;
}

void inspect_peers(struct client *cl, uint64_t req_id)
{
	const struct peer_set *set = &cl->srv->peers;
	Tensord__Reply rep = TENSORD__REPLY__INIT;
	Tensord__PeerListReply pr = TENSORD__PEER_LIST_REPLY__INIT;
	Tensord__PeerInfo **pi;
	Tensord__PeerDnsInfo di[PEER_DNS_MAX], *dp[PEER_DNS_MAX];
	char host[PEER_DNS_MAX][PEER_ADDR_MAX];
	uid_t self = geteuid();

	if (cl->rc.uid != 0 && cl->rc.uid != self) {
		char msg[96];

		snprintf(msg, sizeof(msg),
			 "peers are shown to root and to the daemon's uid (%u) only",
			 (unsigned)self);
		reply_status(cl->conn, TENSORD__REQUEST__BODY_PEER_LIST, req_id, -EPERM, msg);
		return;
	}
	pi = entry_array(set->n_peers, sizeof(**pi));
	if (!pi) {
		reply_status(cl->conn, TENSORD__REQUEST__BODY_PEER_LIST, req_id, -ENOMEM,
			     "out of memory listing peers");
		return;
	}
	for (unsigned i = 0; i < set->n_peers; i++) {
		const struct peer *p = set->peers[i];
		Tensord__PeerInfo *w = pi[i];

		tensord__peer_info__init(w);
		w->name = (char *)p->name;
		w->address = (char *)p->addr;
		w->state = (char *)peer_state_name(p->state);
		w->error = (char *)p->error;
		w->since_ns = p->since_ns;
		w->instance = p->instance;
		w->bytes_in = p->bytes_in;
		w->bytes_out = p->bytes_out;
		w->connects = p->connects;
		w->failures = p->failures;
		w->configured = p->configured;
		w->dialled = p->state == PEER_UP && p->up_dialled;
		w->pulled = p->remote.pulled;
		w->pulled_bytes = p->remote.pulled_bytes;
		w->pull_errors = p->remote.pull_errors;
		w->served = p->remote.served;
		w->served_bytes = p->remote.served_bytes;
		w->replicas = p->remote.replicas;
		w->replica_bytes = p->remote.replica_bytes;
	}
	pr.node = (char *)(set->on ? set->self : "");
	pr.instance = set->on ? set->instance : 0;
	pr.listen = (char *)(set->on ? set->listen_addr : "");
	pr.n_peers = set->n_peers;
	pr.peers = pi;
	pr.n_dns = peer_dns_info(set, di, dp, host);
	pr.dns = dp;
	rep.id = req_id;
	rep.body_case = TENSORD__REPLY__BODY_PEER_LIST;
	rep.peer_list = &pr;
	conn_send(cl->conn, &rep.base, NULL);
	free(pi);
}
