/*
 * The registry's ledger (registry.h): each client's leases (a slot table
 * of generation-counted handles), the uids that hold a tensor's leases and
 * the bytes they pin once it is unlinked, release, a client's end (its
 * names first, then its leases), and the holds that keep legacy IPC
 * memory past a connection (quarantine.c). The name table and lifetimes
 * are registry.c's; what the two share is in registry_int.h.
 */
#include "registry.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/base/log.h"
#include "registry_int.h"

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The entry of uid among t's holders, or NULL. */
static struct reg_holder *holder_find(struct tensor *t, uint32_t uid)
{
	if (t->h0.n && t->h0.uid == uid)
		return &t->h0;
	for (uint32_t i = 0; i < t->n_hv; i++)
		if (t->hv[i].n && t->hv[i].uid == uid)
			return &t->hv[i];
	return NULL;
}

/* One more lease of uid on t. 0 or -ENOMEM. */
static int holder_add(struct tensor *t, uint32_t uid)
{
	struct reg_holder *h = holder_find(t, uid), *nv;

	if (h) {
		h->n++;
		return 0;
	}
	if (!t->h0.n) {
		t->h0 = (struct reg_holder){ uid, 1 };
		return 0;
	}
	for (uint32_t i = 0; i < t->n_hv; i++) {
		if (!t->hv[i].n) {
			t->hv[i] = (struct reg_holder){ uid, 1 };
			return 0;
		}
	}
	nv = realloc(t->hv, (t->n_hv + 1) * sizeof(*nv));
	if (!nv)
		return -ENOMEM;
	t->hv = nv;
	t->hv[t->n_hv++] = (struct reg_holder){ uid, 1 };
	return 0;
}

/* One lease of uid on t fewer; its last one gives back what it pinned. */
static void holder_drop(struct registry *reg, struct tensor *t, uint32_t uid)
{
	struct reg_holder *h = holder_find(t, uid);

	/* holder_add() counted every lease while the quota was on. */
	assert(h && h->n > 0);

	if (!h || --h->n || !t->pinned_bytes)
		return;
	quota_uncharge(reg->quota, uid, QUOTA_PINNED, t->pinned_bytes);
}

void reg_pin_to_holders(struct registry *reg, struct tensor *t)
{
	if (!reg->quota || !t->alloc.footprint || t->pinned_bytes || (!t->h0.n && !t->n_hv))
		return;
	quota_uncharge(reg->quota, t->owner_uid, QUOTA_BYTES, t->bytes_charged);
	t->bytes_charged = 0;
	t->pinned_bytes = t->alloc.footprint;
	if (t->h0.n)
		quota_add(reg->quota, t->h0.uid, QUOTA_PINNED, t->pinned_bytes);
	for (uint32_t i = 0; i < t->n_hv; i++)
		if (t->hv[i].n)
			quota_add(reg->quota, t->hv[i].uid, QUOTA_PINNED, t->pinned_bytes);
}

/* Removes the name; frees the tensor if no lease holds it. */
void registry_client_init(struct reg_client *rc, uint64_t id, uint32_t uid, uint32_t gid,
			  uint32_t pid)
{
	memset(rc, 0, sizeof(*rc));
	LIST_INIT(&rc->created);
	LIST_INIT(&rc->reserves);
	LIST_INIT(&rc->ring_tensors);
	LIST_INIT(&rc->ring_free);
	LIST_INIT(&rc->arenas);
	rc->id = id;
	rc->uid = uid;
	rc->gid = gid;
	rc->pid = pid;
}

int reg_lease_add(struct registry *reg, struct reg_client *rc, struct tensor *t,
		  uint64_t *ret_lease)
{
	uint32_t slot;

	if (reg->quota && holder_add(t, rc->uid) < 0)
		return -ENOMEM;
	if (rc->free_head) {
		slot = rc->free_head - 1;
		rc->free_head = rc->leases[slot].next_free;
	} else {
		if (rc->n_slots >= REGISTRY_LEASES_MAX) {
			if (reg->quota)
				holder_drop(reg, t, rc->uid);
			return -EAGAIN;
		}
		if (rc->n_slots == rc->cap_slots) {
			uint32_t cap = rc->cap_slots ? rc->cap_slots * 2 : 16;
			struct reg_lease *nl = realloc(rc->leases, cap * sizeof(*nl));

			if (!nl) {
				if (reg->quota)
					holder_drop(reg, t, rc->uid);
				return -ENOMEM;
			}
			rc->leases = nl;
			rc->cap_slots = cap;
		}
		slot = rc->n_slots++;
		rc->leases[slot].gen = 0;
	}
	rc->leases[slot].t = t;
	rc->leases[slot].gen++;
	rc->leases[slot].next_free = 0;
	rc->leases[slot].since_ns = mono_ns();
	rc->leases[slot].bind_slot = 0;
	rc->n_leases++;
	reg->n_leases++;
	t->refcount++;
	*ret_lease = (uint64_t)rc->leases[slot].gen << 32 | (slot + 1);
	return 0;
}

/* Empties rc's lease slot; returns its tensor, whose reference the caller now has. */
static struct tensor *slot_take(struct registry *reg, struct reg_client *rc, uint32_t slot)
{
	struct tensor *t = rc->leases[slot].t;

	assert(t && t->refcount > 0 && rc->n_leases > 0);
	reg_binding_end(rc, slot);
	rc->leases[slot].t = NULL;
	rc->leases[slot].next_free = rc->free_head;
	rc->free_head = slot + 1;
	rc->n_leases--;
	reg->n_leases--;
	return t;
}

/* A reference of uid's on t goes; the last one of an unlinked tensor frees it. */
static void tensor_let_go(struct registry *reg, struct tensor *t, uint32_t uid)
{
	if (reg->quota)
		holder_drop(reg, t, uid);
	if (--t->refcount == 0 && t->state == TENSORD_STATE_UNLINKED)
		reg_tensor_free(reg, t);
}

static void lease_drop_slot(struct registry *reg, struct reg_client *rc, uint32_t slot)
{
	tensor_let_go(reg, slot_take(reg, rc, slot), rc->uid);
}

/* The slot of a live lease, or -1. */
static long lease_slot(const struct reg_client *rc, uint64_t lease)
{
	uint32_t slot = (uint32_t)lease - 1, gen = (uint32_t)(lease >> 32);

	if ((uint32_t)lease == 0 || slot >= rc->n_slots || !rc->leases[slot].t ||
	    rc->leases[slot].gen != gen)
		return -1;
	return slot;
}

struct tensor *registry_lease_tensor(struct reg_client *rc, uint64_t lease)
{
	long slot = lease_slot(rc, lease);

	return slot < 0 ? NULL : rc->leases[slot].t;
}

int registry_release(struct registry *reg, struct reg_client *rc, uint64_t lease)
{
	long slot = lease_slot(rc, lease);

	if (slot < 0)
		return -ESRCH;
	log_debug("tensor '%s': lease %llx released by pid %u", rc->leases[slot].t->name,
		  (unsigned long long)lease, rc->pid);
	lease_drop_slot(reg, rc, (uint32_t)slot);
	return 0;
}

void registry_client_gone(struct registry *reg, struct reg_client *rc)
{
	struct tensor *t;

	/* Names first: a tensor it created but never published, or created
	 * with connection lifetime, goes with it. Leases second, so the last
	 * one frees the memory. Only what rc created and leased is visited.
	 * Its ring first: nobody can write its buffers again. */
	reg_ring_client_gone(reg, rc);
	reg_reserves_drop(reg, rc);
	reg_tx_client_gone(reg, rc);
	while ((t = LIST_FIRST(&rc->created))) {
		reg->visits++;
		reg_creator_unlink(t);
		if (t->state == TENSORD_STATE_CREATED || (t->flags & TENSORD_LIFETIME_CONNECTION)) {
			log_debug("tensor '%s': unlinked with its creator's connection", t->name);
			/* Leases of this client still hold it; they are dropped below.
			 * One with no lease left is freed now; one leased by others
			 * lives on until their last lease. A draft goes, and the
			 * version it would have replaced stays. The names it had
			 * published go in one commit step. */
			if (t->state == TENSORD_STATE_PUBLISHED)
				reg_step_unlinked(reg, t);
			reg_tensor_unlink(reg, t);
		}
	}
	reg_step_end(reg);
	reg->visits += rc->n_slots;
	for (uint32_t s = 0; s < rc->n_slots; s++)
		if (rc->leases[s].t)
			lease_drop_slot(reg, rc, s);
	reg_page_free(rc);
	free(rc->leases);
	rc->leases = NULL;
	rc->n_slots = rc->cap_slots = rc->free_head = 0;
}

struct reg_hold *registry_client_hold(struct registry *reg, struct reg_client *rc)
{
	struct reg_hold *h;
	uint32_t n = 0, k = 0;

	for (uint32_t s = 0; s < rc->n_slots; s++)
		n += rc->leases[s].t && td_gpu_handle_ipc(rc->leases[s].t->alloc.handle_kind);
	reg->visits += rc->n_slots;
	if (!n)
		return NULL;
	h = malloc(sizeof(*h) + n * sizeof(h->t[0]));
	if (!h) {
		log_error("conn %llu: pid %u: out of memory to keep the memory of %u legacy IPC "
			  "leases past the connection: it is freed now, while the process may "
			  "still have it open",
			  (unsigned long long)rc->id, rc->pid, n);
		return NULL;
	}
	h->conn_id = rc->id;
	h->uid = rc->uid;
	h->pid = rc->pid;
	h->bytes = 0;
	h->n = n;
	for (uint32_t s = 0; s < rc->n_slots; s++) {
		struct tensor *t = rc->leases[s].t;

		if (!t || !td_gpu_handle_ipc(t->alloc.handle_kind))
			continue;
		/* The lease's reference and its uid's holder count go to the hold. */
		slot_take(reg, rc, s);
		assert(t->dev);
		if (t->holds++ == 0) {
			t->dev->quarantined += t->alloc.footprint;
			h->bytes += t->alloc.footprint;
		}
		h->t[k++] = t;
	}
	LIST_INSERT_HEAD(&reg->holds, h, link);
	reg->n_holds++;
	return h;
}

void registry_hold_end(struct registry *reg, struct reg_hold *h)
{
	LIST_REMOVE(h, link);
	reg->n_holds--;
	for (uint32_t i = 0; i < h->n; i++) {
		struct tensor *t = h->t[i];

		assert(t->holds > 0 && t->refcount >= t->holds);
		if (--t->holds == 0)
			t->dev->quarantined -= t->alloc.footprint;
		tensor_let_go(reg, t, h->uid);
	}
	free(h);
}
