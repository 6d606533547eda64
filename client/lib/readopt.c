/*
 * libtensord: leases re-adopted after a restart (docs/restart.md, section
 * 5). When a connection was lost and its successor reaches a daemon of the
 * same lineage that is another instance (a restarted daemon that restored
 * its predecessor's tensors), the leases that lived on the lost connection
 * are offered to the new daemon by name and generation (Readopt). Each it
 * takes moves to the successor with its new id, so that `tensorctl
 * leases` shows it again, the memory stays counted as held, and its end
 * is a Release the new daemon hears. One it does not take (not restored,
 * the grace period over) stays where it was: its mapping is the
 * process's and stays valid, and its end goes nowhere.
 *
 * Leases are never referenced across the unlocked round trip (a deleter
 * may end one meanwhile): they are named by their serial, and found again
 * under the locks, the lost connection's first, then its successor's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "lease_int.h"

/* Leases per Readopt: the daemon takes up to 4096. */
#define READOPT_BATCH 1024

struct readopt_item {
	uint64_t serial;
	uint64_t generation;
	uint64_t lease; /* the new daemon's; 0: not re-adopted */
	char name[TENSORD_NAME_MAX + 1];
};

static int cmp_serial(const void *a, const void *b)
{
	const struct readopt_item *x = a, *y = b;

	return x->serial < y->serial ? -1 : x->serial > y->serial;
}

/* The leases on old worth offering: published versions it still holds. */
static struct readopt_item *collect(tensord_client *old, size_t *ret_n)
{
	struct readopt_item *v = NULL;
	struct td_lease *l;
	size_t n = 0, cap = 0;

	pthread_mutex_lock(&old->lock);
	LIST_FOREACH(l, &old->leases, live_link)
	{
		if (!l->info.generation || !l->info.name[0] || l->released_by_close)
			continue;
		if (n == cap) {
			size_t ncap = cap ? cap * 2 : 64;
			struct readopt_item *nv = realloc(v, ncap * sizeof(*nv));

			if (!nv)
				break; /* the rest are not offered: their ends go nowhere */
			v = nv;
			cap = ncap;
		}
		v[n].serial = l->serial;
		v[n].generation = l->info.generation;
		v[n].lease = 0;
		snprintf(v[n].name, sizeof(v[n].name), "%s", l->info.name);
		n++;
	}
	pthread_mutex_unlock(&old->lock);
	qsort(v, n, sizeof(*v), cmp_serial);
	*ret_n = n;
	return v;
}

/* Offers v[0..n) to succ's daemon: each item's lease is set where it took it. */
static int offer(tensord_client *succ, struct readopt_item *v, size_t n)
{
	Tensord__ReadoptLease *items = calloc(n, sizeof(*items));
	Tensord__ReadoptLease **pitems = calloc(n, sizeof(*pitems));
	Tensord__Request req = TENSORD__REQUEST__INIT;
	Tensord__Readopt ro = TENSORD__READOPT__INIT;
	Tensord__Reply *rep;
	int r;

	if (!items || !pitems) {
		free(items);
		free(pitems);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		tensord__readopt_lease__init(&items[i]);
		items[i].name = v[i].name;
		items[i].generation = v[i].generation;
		pitems[i] = &items[i];
	}
	ro.n_leases = n;
	ro.leases = pitems;
	req.body_case = TENSORD__REQUEST__BODY_READOPT;
	req.readopt = &ro;
	r = td_rpc(succ, &req, &rep, NULL);
	free(items);
	free(pitems);
	if (r < 0)
		return r;
	if (rep->body_case == TENSORD__REPLY__BODY_READOPT && rep->readopt->n_lease == n)
		for (size_t i = 0; i < n; i++)
			v[i].lease = rep->readopt->lease[i];
	else
		r = -EPROTO;
	tensord__reply__free_unpacked(rep, NULL);
	return r;
}

/* The item of serial s, or NULL. */
static struct readopt_item *find(struct readopt_item *v, size_t n, uint64_t s)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (v[mid].serial == s)
			return &v[mid];
		if (v[mid].serial < s)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/*
 * Moves the leases the daemon took from old to succ; returns how many
 * moved off a client that was not their own (each held a reference on
 * old, the caller's to drop). Items whose lease moved get lease 0.
 */
static unsigned move(tensord_client *old, tensord_client *succ, struct readopt_item *v, size_t n)
{
	struct td_lease *l, *next;
	unsigned unrefs = 0;
	bool woke = false;

	pthread_mutex_lock(&old->lock);
	pthread_mutex_lock(&succ->lock);
	for (l = LIST_FIRST(&old->leases); l; l = next) {
		struct readopt_item *it = find(v, n, l->serial);

		next = LIST_NEXT(l, live_link);
		if (!it || !it->lease)
			continue;
		LIST_REMOVE(l, live_link);
		LIST_INSERT_HEAD(&succ->leases, l, live_link);
		atomic_fetch_sub(&old->n_live, 1);
		if (atomic_fetch_add(&succ->n_live, 1) == 0)
			woke = true;
		l->lease_id = it->lease;
		it->lease = 0;
		td_client_ref(succ);
		if (old != l->c)
			unrefs++;
		atomic_store(&l->at, succ);
	}
	pthread_mutex_unlock(&succ->lock);
	pthread_mutex_unlock(&old->lock);
	if (woke)
		td_relq_live(succ);
	return unrefs;
}

unsigned td_lease_readopt(tensord_client *old, tensord_client *succ)
{
	struct readopt_item *v;
	size_t n, moved = 0;
	unsigned unrefs;
	char saved[512];

	v = collect(old, &n);
	if (!n) {
		free(v);
		return 0;
	}
	/* What the caller was doing keeps its message. */
	snprintf(saved, sizeof(saved), "%s", tensord_last_error());
	for (size_t i = 0; i < n; i += READOPT_BATCH)
		if (offer(succ, v + i, n - i < READOPT_BATCH ? n - i : READOPT_BATCH) < 0)
			break; /* the successor is lost too, or an old daemon: the rest stay */
	for (size_t i = 0; i < n; i++)
		moved += v[i].lease != 0;
	unrefs = move(old, succ, v, n);
	/* Re-adopted, but ended meanwhile: end them on the new daemon too. */
	for (size_t i = 0; i < n; i++) {
		if (v[i].lease) {
			td_release(succ, v[i].lease);
			moved--;
		}
	}
	while (unrefs--)
		td_client_unref(old);
	td_set_error(0, "%s", saved);
	free(v);
	return (unsigned)moved;
}
