/*
 * libtensord: inspection requests. tensord_leases() and tensord_clients()
 * fetch every page the daemon offers (it caps each reply) and hand back one
 * array; tensord_metrics() the exposition text.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "common/desc.h"

/* Room for have + add records of size sz in *v. 0 or -ENOMEM (message set). */
static int reserve(void **v, size_t *cap, size_t have, size_t add, size_t sz)
{
	size_t ncap = *cap ? *cap : 16;
	void *nv;

	if (*v && have + add <= *cap)
		return 0;
	while (ncap < have + add)
		ncap *= 2;
	nv = realloc(*v, ncap * sz);
	if (!nv)
		return td_set_error(-ENOMEM, "out of memory for %zu records", have + add);
	*v = nv;
	*cap = ncap;
	return 0;
}

static void holder_from_wire(tensord_lease_holder *h, const Tensord__LeaseHolder *w)
{
	memset(h, 0, sizeof(*h));
	snprintf(h->name, sizeof(h->name), "%s", w->name);
	h->tensor_id = w->tensor_id;
	h->state = (tensord_state)w->state;
	h->pid = w->pid;
	h->uid = w->uid;
	h->gid = w->gid;
	snprintf(h->comm, sizeof(h->comm), "%s", w->comm);
	h->count = w->count;
	h->conn_id = w->conn_id;
	h->since_ns = w->since_ns;
	h->held_ns = w->held_ns;
	snprintf(h->label, sizeof(h->label), "%s", w->label);
	h->bytes = w->bytes;
	h->commit = w->commit;
}

/*
 * One page of the answer to req, whose reply must be of kind body: on
 * success *ret_rep is the caller's (tensord__reply__free_unpacked()).
 */
static int page(tensord_client *c, Tensord__Request *req, Tensord__Reply__BodyCase body,
		const char *what, Tensord__Reply **ret_rep)
{
	int r = td_rpc(c, req, ret_rep, NULL);

	if (r < 0)
		return r;
	if ((*ret_rep)->body_case != body) {
		tensord__reply__free_unpacked(*ret_rep, NULL);
		return td_set_error(-EPROTO, "tensord answered %s with something else", what);
	}
	return 0;
}

struct page_call {
	Tensord__Request *req;
	Tensord__Reply__BodyCase body;
	const char *what;
	Tensord__Reply **ret_rep;
};

static int page_once(tensord_client *c, void *arg)
{
	struct page_call *a = arg;

	return page(c, a->req, a->body, a->what, a->ret_rep);
}

/* page() of an answer in one reply, sent once more when the daemon went away meanwhile. */
static int whole(tensord_client *c, Tensord__Request *req, Tensord__Reply__BodyCase body,
		 const char *what, Tensord__Reply **ret_rep)
{
	struct page_call a = { req, body, what, ret_rep };

	return td_read(c, page_once, &a);
}

/* By tensor id, then connection: the order tensord_leases() promises. */
static int cmp_holder(const void *a, const void *b)
{
	const tensord_lease_holder *x = a, *y = b;

	if (x->tensor_id != y->tensor_id)
		return x->tensor_id < y->tensor_id ? -1 : 1;
	return x->conn_id < y->conn_id ? -1 : x->conn_id > y->conn_id;
}

/*
 * A connection's leases on one tensor come as one entry per page that saw
 * some of them (proto/tensord.proto, LeaseList): sorts v and adds those
 * entries up. Returns the count left.
 */
static size_t fold_holders(tensord_lease_holder *v, size_t n)
{
	size_t out = 0;

	if (n)
		qsort(v, n, sizeof(*v), cmp_holder);
	for (size_t i = 0; i < n; i++) {
		tensord_lease_holder *last = out ? &v[out - 1] : NULL;

		if (last && last->tensor_id == v[i].tensor_id && last->conn_id == v[i].conn_id) {
			uint64_t sum = (uint64_t)last->count + v[i].count;

			/* The daemon clamps each page's count at INT32_MAX: so does the sum. */
			last->count = sum > INT32_MAX ? INT32_MAX : (uint32_t)sum;
			if (v[i].since_ns < last->since_ns) {
				last->since_ns = v[i].since_ns;
				last->held_ns = v[i].held_ns;
			}
			continue;
		}
		v[out++] = v[i];
	}
	return out;
}

struct leases_call {
	const char *name;
	tensord_lease_holder **ret_holders;
	size_t *ret_count;
};

/* Every page, from the first: one daemon's answer, also across a restart. */
static int leases_all(tensord_client *c, void *arg)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__LeaseList ll = TENSORD__LEASE_LIST__INIT;
	struct leases_call *a = arg;
	tensord_lease_holder *v = NULL;
	size_t n = 0, cap = 0;
	Tensord__Reply *rep;
	bool more = true;
	int r;

	ll.name = (char *)(a->name ? a->name : "");
	req.body_case = TENSORD__REQUEST__BODY_LEASE_LIST;
	req.lease_list = &ll;
	while (more) {
		r = page(c, &req, TENSORD__REPLY__BODY_LEASE_LIST, "leases", &rep);
		if (r == 0)
			r = reserve((void **)&v, &cap, n, rep->lease_list->n_holders + 1,
				    sizeof(*v));
		if (r < 0) {
			free(v);
			return r;
		}
		for (size_t i = 0; i < rep->lease_list->n_holders; i++)
			holder_from_wire(&v[n++], rep->lease_list->holders[i]);
		/* A page may be empty and say "more"; one that leaves the cursor
		 * where it was would loop forever. A daemon from before the cursor
		 * (protocol fields next_conn/next_slot) sends none and pages by the
		 * last entry. */
		more = rep->lease_list->more;
		if (more && !rep->lease_list->next_conn && rep->lease_list->n_holders) {
			ll.after_tensor = v[n - 1].tensor_id;
			ll.after_conn = v[n - 1].conn_id;
		} else if (more && rep->lease_list->next_conn == ll.after_conn &&
			   rep->lease_list->next_slot == ll.after_slot) {
			r = td_set_error(-EPROTO, "tensord's lease list did not move on");
		} else {
			ll.after_conn = rep->lease_list->next_conn;
			ll.after_slot = rep->lease_list->next_slot;
		}
		tensord__reply__free_unpacked(rep, NULL);
		if (r < 0) {
			free(v);
			return r;
		}
	}
	*a->ret_holders = v;
	*a->ret_count = fold_holders(v, n);
	return 0;
}

int tensord_leases(tensord_client *c, const char *name, tensord_lease_holder **ret_holders,
		   size_t *ret_count)
{
	struct leases_call a = { name, ret_holders, ret_count };
	char why[300];

	if (name && *name && td_name_check(name, strlen(name), why, sizeof(why)) < 0)
		return td_set_error(-EINVAL, "%s", why);
	return td_read(c, leases_all, &a);
}

static void client_from_wire(tensord_client_info *ci, const Tensord__ClientInfo *w)
{
	memset(ci, 0, sizeof(*ci));
	ci->conn_id = w->conn_id;
	ci->pid = w->pid;
	ci->uid = w->uid;
	ci->gid = w->gid;
	snprintf(ci->comm, sizeof(ci->comm), "%s", w->comm);
	snprintf(ci->client, sizeof(ci->client), "%s", w->client);
	ci->connected_ns = w->connected_ns;
	ci->leases = w->leases;
	ci->waiters = w->waiters;
	ci->tensors_created = w->tensors_created;
	ci->bytes_queued = w->bytes_queued;
	ci->requests = w->requests;
	snprintf(ci->label, sizeof(ci->label), "%s", w->label);
}

struct clients_call {
	tensord_client_info **ret_clients;
	size_t *ret_count;
};

/* Every page, from the first: one daemon's answer, also across a restart. */
static int clients_all(tensord_client *c, void *arg)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__ClientList cl = TENSORD__CLIENT_LIST__INIT;
	struct clients_call *a = arg;
	tensord_client_info *v = NULL;
	size_t n = 0, cap = 0;
	Tensord__Reply *rep;
	bool more = true;
	int r;

	req.body_case = TENSORD__REQUEST__BODY_CLIENT_LIST;
	req.client_list = &cl;
	while (more) {
		r = page(c, &req, TENSORD__REPLY__BODY_CLIENT_LIST, "clients", &rep);
		if (r == 0)
			r = reserve((void **)&v, &cap, n, rep->client_list->n_clients + 1,
				    sizeof(*v));
		if (r < 0) {
			free(v);
			return r;
		}
		for (size_t i = 0; i < rep->client_list->n_clients; i++)
			client_from_wire(&v[n++], rep->client_list->clients[i]);
		more = rep->client_list->more && rep->client_list->n_clients;
		if (more)
			cl.after = v[n - 1].conn_id;
		tensord__reply__free_unpacked(rep, NULL);
	}
	*a->ret_clients = v;
	*a->ret_count = n;
	return 0;
}

int tensord_clients(tensord_client *c, tensord_client_info **ret_clients, size_t *ret_count)
{
	struct clients_call a = { ret_clients, ret_count };

	return td_read(c, clients_all, &a);
}

/*
 * The daemon's PeerList (one reply holds it all) and a zeroed array for
 * its peers, or for its DNS names of peers when dns: 0 with *ret_rep the
 * caller's (tensord__reply__free_unpacked()) and *ret_v, *ret_n records
 * of size sz, the caller's too; or -errno (message set).
 */
static int peer_list(tensord_client *c, bool dns, size_t sz, Tensord__Reply **ret_rep, void **ret_v,
		     size_t *ret_n)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__PeerList pl = TENSORD__PEER_LIST__INIT;
	Tensord__Reply *rep;
	size_t n;
	void *v;
	int r;

	req.body_case = TENSORD__REQUEST__BODY_PEER_LIST;
	req.peer_list = &pl;
	r = whole(c, &req, TENSORD__REPLY__BODY_PEER_LIST, "peers", &rep);
	if (r < 0)
		return r;
	n = dns ? rep->peer_list->n_dns : rep->peer_list->n_peers;
	v = calloc(n ? n : 1, sz);
	if (!v) {
		tensord__reply__free_unpacked(rep, NULL);
		return td_set_error(-ENOMEM, "out of memory for %zu %s", n,
				    dns ? "DNS names of peers" : "peers");
	}
	*ret_rep = rep;
	*ret_v = v;
	*ret_n = n;
	return 0;
}

int tensord_peers(tensord_client *c, char *node, tensord_peer_info **ret_peers, size_t *ret_count)
{
	tensord_peer_info *v;
	Tensord__Reply *rep;
	size_t n;
	int r;

	r = peer_list(c, false, sizeof(*v), &rep, (void **)&v, &n);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n; i++) {
		const Tensord__PeerInfo *w = rep->peer_list->peers[i];
		tensord_peer_info *p = &v[i];

		snprintf(p->name, sizeof(p->name), "%s", w->name);
		snprintf(p->address, sizeof(p->address), "%s", w->address);
		snprintf(p->state, sizeof(p->state), "%s", w->state);
		snprintf(p->error, sizeof(p->error), "%s", w->error);
		p->since_ns = w->since_ns;
		p->instance = w->instance;
		p->bytes_in = w->bytes_in;
		p->bytes_out = w->bytes_out;
		p->connects = w->connects;
		p->failures = w->failures;
		p->configured = w->configured;
		p->dialled = w->dialled;
		p->pulled = w->pulled;
		p->pulled_bytes = w->pulled_bytes;
		p->pull_errors = w->pull_errors;
		p->served = w->served;
		p->served_bytes = w->served_bytes;
		p->replicas = w->replicas;
		p->replica_bytes = w->replica_bytes;
	}
	if (node)
		snprintf(node, 64, "%s", rep->peer_list->node);
	tensord__reply__free_unpacked(rep, NULL);
	*ret_peers = v;
	*ret_count = n;
	return 0;
}

int tensord_peers_dns(tensord_client *c, tensord_peer_dns_info **ret_dns, size_t *ret_count)
{
	tensord_peer_dns_info *v;
	Tensord__Reply *rep;
	size_t n;
	int r;

	r = peer_list(c, true, sizeof(*v), &rep, (void **)&v, &n);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n; i++) {
		const Tensord__PeerDnsInfo *w = rep->peer_list->dns[i];
		tensord_peer_dns_info *d = &v[i];

		snprintf(d->host, sizeof(d->host), "%s", w->host);
		d->addresses = w->addresses;
		d->self = w->self;
		d->resolutions = w->resolutions;
		d->failures = w->failures;
		snprintf(d->error, sizeof(d->error), "%s", w->error);
	}
	tensord__reply__free_unpacked(rep, NULL);
	*ret_dns = v;
	*ret_count = n;
	return 0;
}

int tensord_metrics(tensord_client *c, char **ret_text)
{
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Metrics m = TENSORD__METRICS__INIT;
	Tensord__Reply *rep;
	char *text;
	int r;

	req.body_case = TENSORD__REQUEST__BODY_METRICS;
	req.metrics = &m;
	r = whole(c, &req, TENSORD__REPLY__BODY_METRICS, "metrics", &rep);
	if (r < 0)
		return r;
	text = strdup(rep->metrics->text);
	tensord__reply__free_unpacked(rep, NULL);
	if (!text)
		return td_set_error(-ENOMEM, "out of memory for the metrics text");
	*ret_text = text;
	return 0;
}
