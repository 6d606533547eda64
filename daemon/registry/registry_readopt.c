/*
 * The restart hold (docs/restart.md, sections 4 and 5): every tensor a
 * restart restored is held, as a lease holds one, until the grace period
 * ends (--readopt-grace), so that a process that held leases on it under
 * the previous daemon can re-adopt them (Readopt) by name and generation,
 * also when the name went to a later version meanwhile. At the end the
 * hold lets go: a held tensor whose name is gone and that nobody
 * re-adopted is freed then.
 *
 * (name, generation) names one version for the life of a lineage
 * (commit.c never gives it out twice), so the client's word for what it
 * holds cannot be mistaken for another version's.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/log.h"
#include "registry.h"
#include "registry_int.h"

struct reg_readopt {
	struct tensor **t; /* each holds one reference (refcount) */
	uint32_t n, cap;
	bool sorted; /* by name, then generation */
};

void registry_readopt_hold(struct registry *reg, struct tensor *t)
{
	struct reg_readopt *h = reg->readopt;

	if (!h) {
		h = calloc(1, sizeof(*h));
		if (!h)
			goto nomem;
		reg->readopt = h;
	}
	if (h->n == h->cap) {
		uint32_t cap = h->cap ? h->cap * 2 : 256;
		struct tensor **nv = realloc(h->t, cap * sizeof(*nv));

		if (!nv)
			goto nomem;
		h->t = nv;
		h->cap = cap;
	}
	h->t[h->n++] = t;
	h->sorted = false;
	t->refcount++;
	reg->n_held = h->n;
	return;
nomem:
	/* Nothing lost but the hold: its leases cannot be re-adopted once its name goes. */
	log_warn("tensor '%s': out of memory to hold it for re-adoption", t->name);
}

static int cmp_held(const void *a, const void *b)
{
	const struct tensor *x = *(struct tensor *const *)a, *y = *(struct tensor *const *)b;
	int c = strcmp(x->name, y->name);

	if (c)
		return c;
	return x->generation < y->generation ? -1 : x->generation > y->generation;
}

/* The held version (name, generation), or NULL. */
static struct tensor *held_find(struct reg_readopt *h, const char *name, uint64_t generation)
{
	uint32_t lo = 0, hi = h->n;

	if (!h->sorted) {
		qsort(h->t, h->n, sizeof(h->t[0]), cmp_held);
		h->sorted = true;
	}
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		struct tensor *t = h->t[mid];
		int c = strcmp(name, t->name);

		if (!c)
			c = generation < t->generation ? -1 : generation > t->generation;
		if (!c)
			return t;
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

int registry_readopt(struct registry *reg, struct reg_client *rc, const char *name,
		     uint64_t generation, uint64_t *ret_lease)
{
	struct tensor *t;
	int r;

	if (!reg->readopt || !generation)
		return -ENOENT;
	t = held_find(reg->readopt, name, generation);
	if (!t)
		return -ENOENT;
	if (!registry_may_read(t, rc))
		return -EACCES;
	r = reg_lease_add(reg, rc, t, ret_lease);
	if (r == 0)
		reg->readopted++;
	return r;
}

void registry_readopt_end(struct registry *reg)
{
	struct reg_readopt *h = reg->readopt;
	uint32_t freed = 0;

	if (!h)
		return;
	reg->readopt = NULL;
	for (uint32_t i = 0; i < h->n; i++) {
		struct tensor *t = h->t[i];

		if (--t->refcount == 0 && t->state == TENSORD_STATE_UNLINKED) {
			reg_tensor_free(reg, t);
			freed++;
		}
	}
	reg->held_freed += freed;
	reg->n_held = 0;
	free(h->t);
	free(h);
}
