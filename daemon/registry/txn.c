/*
 * Transactions (docs/design.md, "Transactions: several changes, one
 * commit"): a client's staged members and unlinks, published and unlinked
 * in one commit step, or discarded without a trace.
 *
 * Ownership: the client (struct reg_client) owns its transactions; a
 * transaction owns its staged names and borrows its members, which point
 * back at it (tensor.tx) and leave it when they are freed.
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/log.h"
#include "registry_int.h"

struct reg_staged {
	LIST_ENTRY(reg_staged) link;
	size_t len;
	char name[];
};

struct reg_tx {
	uint32_t id;
	LIST_ENTRY(reg_tx) link;         /* on its client's list */
	TAILQ_HEAD(, tensor) members;    /* borrowed, in the order staged */
	LIST_HEAD(, reg_staged) unlinks; /* owned, newest first */
	uint32_t n_members, n_unlinks;
	/* The ones its members go into (registry_arena.c): host [0], GPU [1]; NULL: none. */
	struct reg_arena *arena[2];
};

struct reg_arena *reg_tx_arena(const struct reg_tx *tx, bool gpu)
{
	return tx->arena[gpu];
}

void reg_tx_set_arena(struct registry *reg, struct reg_tx *tx, bool gpu, struct reg_arena *a)
{
	if (tx->arena[gpu])
		reg_arena_close(reg, tx->arena[gpu]);
	tx->arena[gpu] = a;
}

uint32_t reg_tx_id(const struct reg_tx *tx)
{
	return tx->id;
}

static struct reg_tx *tx_find(struct reg_client *rc, uint32_t id)
{
	struct reg_tx *tx;

	LIST_FOREACH(tx, &rc->txs, link)
	if (tx->id == id)
		return tx;
	return NULL;
}

int reg_tx_get(struct reg_client *rc, uint32_t id, bool stage, struct reg_tx **ret_tx, char *why,
	       size_t why_len)
{
	struct reg_tx *tx = tx_find(rc, id);

	*ret_tx = NULL; /* every failure leaves nothing to use by mistake */
	if (tx) {
		if (stage && tx->n_members + tx->n_unlinks >= REGISTRY_TX_MEMBERS_MAX) {
			snprintf(why, why_len,
				 "transaction %u: it has %u members and staged unlinks, the most "
				 "one may have",
				 id, REGISTRY_TX_MEMBERS_MAX);
			return -E2BIG;
		}
		*ret_tx = tx;
		return 0;
	}
	if (!stage) {
		snprintf(why, why_len,
			 "transaction %u: no such transaction (nothing staged, or it "
			 "ended)",
			 id);
		return -ENOENT;
	}
	if (rc->n_txs >= REGISTRY_TX_PER_CLIENT) {
		snprintf(why, why_len,
			 "transaction %u: %u transactions are open on this connection, "
			 "the most one may have",
			 id, REGISTRY_TX_PER_CLIENT);
		return -EAGAIN;
	}
	tx = calloc(1, sizeof(*tx));
	if (!tx) {
		snprintf(why, why_len, "transaction %u: out of memory", id);
		return -ENOMEM;
	}
	tx->id = id;
	TAILQ_INIT(&tx->members);
	LIST_INIT(&tx->unlinks);
	LIST_INSERT_HEAD(&rc->txs, tx, link);
	rc->n_txs++;
	*ret_tx = tx;
	return 0;
}

void reg_tx_add(struct reg_tx *tx, struct tensor *t)
{
	assert(!t->tx);
	t->tx = tx;
	TAILQ_INSERT_TAIL(&tx->members, t, tx_link);
	tx->n_members++;
}

void reg_tx_remove(struct tensor *t)
{
	if (!t->tx)
		return;
	TAILQ_REMOVE(&t->tx->members, t, tx_link);
	t->tx->n_members--;
	t->tx = NULL;
}

/* Ends tx: its members discarded (drafts let go; the names they replace keep their version). */
static void tx_end(struct registry *reg, struct reg_client *rc, struct reg_tx *tx)
{
	struct reg_staged *s;
	struct tensor *t;

	while ((t = TAILQ_FIRST(&tx->members))) {
		reg_tx_remove(t);
		reg_tensor_unlink(reg, t);
	}
	while ((s = LIST_FIRST(&tx->unlinks))) {
		LIST_REMOVE(s, link);
		free(s);
	}
	reg_tx_set_arena(reg, tx, false, NULL);
	reg_tx_set_arena(reg, tx, true, NULL);
	LIST_REMOVE(tx, link);
	rc->n_txs--;
	free(tx);
}

int registry_tx_unlink(struct registry *reg, struct reg_client *rc, uint32_t id, const char *name,
		       size_t len, char *why, size_t why_len)
{
	struct tensor *t = reg_find_named(reg, name, len);
	struct reg_staged *s;
	struct reg_tx *tx;
	int r;

	if (!t || t->state != TENSORD_STATE_PUBLISHED) {
		snprintf(why, why_len, "tensor '%.*s': no such tensor", (int)len, name);
		return -ENOENT;
	}
	if (!reg_may_unlink(t, rc)) {
		snprintf(why, why_len, "tensor '%s': owned by uid %u, mode %03o refuses uid %u",
			 t->name, t->owner_uid, t->mode, rc->uid);
		return -EPERM;
	}
	r = reg_tx_get(rc, id, true, &tx, why, why_len);
	if (r < 0)
		return r;
	if (t->draft && t->draft->tx == tx) {
		snprintf(why, why_len, "tensor '%s': its new version is a member of transaction %u",
			 t->name, id);
		return -EINVAL;
	}
	s = malloc(sizeof(*s) + len + 1);
	if (!s) {
		snprintf(why, why_len, "tensor '%s': out of memory", t->name);
		return -ENOMEM;
	}
	s->len = len;
	memcpy(s->name, name, len);
	s->name[len] = '\0';
	LIST_INSERT_HEAD(&tx->unlinks, s, link);
	tx->n_unlinks++;
	return 0;
}

/* Phase one of a commit: everything that can fail. 0 or -errno with the reason. */
static int commit_check(struct registry *reg, struct reg_client *rc, struct reg_tx *tx, char *why,
			size_t why_len)
{
	struct reg_staged *s;
	struct tensor *t;
	int r;

	if (reg_step_reserve(reg, (size_t)tx->n_members + tx->n_unlinks) < 0) {
		snprintf(why, why_len, "transaction %u: out of memory", tx->id);
		return -ENOMEM;
	}
	LIST_FOREACH(s, &tx->unlinks, link)
	{
		t = reg_find_named(reg, s->name, s->len);
		if (!t || t->state != TENSORD_STATE_PUBLISHED) {
			snprintf(why, why_len,
				 "transaction %u: tensor '%s': no such tensor any more, to unlink",
				 tx->id, s->name);
			return -ENOENT;
		}
		if (!reg_may_unlink(t, rc)) {
			snprintf(why, why_len,
				 "transaction %u: tensor '%s': no longer yours to unlink", tx->id,
				 s->name);
			return -EPERM;
		}
	}
	TAILQ_FOREACH(t, &tx->members, tx_link)
	{
		char reason[400];

		r = reg_publish_ready(reg, t, reason, sizeof(reason));
		if (r < 0) {
			snprintf(why, why_len, "transaction %u: %s", tx->id, reason);
			return r;
		}
	}
	return 0;
}

int registry_tx_commit(struct registry *reg, struct reg_client *rc, uint32_t id,
		       uint64_t *ret_commit, uint32_t *ret_published, uint32_t *ret_unlinked,
		       char *why, size_t why_len)
{
	uint32_t published = 0, unlinked = 0;
	struct reg_staged *s;
	struct reg_tx *tx;
	struct tensor *t;
	int r = reg_tx_get(rc, id, false, &tx, why, why_len); /* a full one commits */

	if (r < 0)
		return r;
	r = commit_check(reg, rc, tx, why, why_len);
	if (r < 0) {
		log_debug("transaction %u of pid %u: aborted: %s", id, rc->pid, why);
		tx_end(reg, rc, tx);
		return r;
	}
	/* Phase two: nothing fails from here on; one step, one commit id, the
	 * members in the order they were staged. */
	*ret_commit = tx->n_members + tx->n_unlinks ? reg_step_commit(reg) : 0;
	while ((t = TAILQ_FIRST(&tx->members))) {
		reg_tx_remove(t);
		reg_publish_now(reg, t);
		published++;
	}
	while ((s = LIST_FIRST(&tx->unlinks))) {
		/* A name staged twice is found the first time only. */
		t = reg_find_named(reg, s->name, s->len);
		if (t && t->state == TENSORD_STATE_PUBLISHED) {
			reg_step_unlinked(reg, t);
			reg_tensor_unlink(reg, t);
			unlinked++;
		}
		LIST_REMOVE(s, link);
		free(s);
	}
	log_debug("transaction %u of pid %u: commit %llu, %u published, %u unlinked", id, rc->pid,
		  (unsigned long long)*ret_commit, published, unlinked);
	tx_end(reg, rc, tx);
	*ret_published = published;
	*ret_unlinked = unlinked;
	reg_step_end(reg);
	return 0;
}

void registry_tx_discard(struct registry *reg, struct tensor *t)
{
	reg_tx_remove(t);
	reg_tensor_unlink(reg, t);
}

int registry_tx_abort(struct registry *reg, struct reg_client *rc, uint32_t id, char *why,
		      size_t why_len)
{
	struct reg_tx *tx = tx_find(rc, id);

	if (!tx) {
		snprintf(why, why_len,
			 "transaction %u: no such transaction (nothing staged, or it "
			 "ended)",
			 id);
		return -ENOENT;
	}
	tx_end(reg, rc, tx);
	return 0;
}

void reg_tx_client_gone(struct registry *reg, struct reg_client *rc)
{
	struct reg_tx *tx;

	while ((tx = LIST_FIRST(&rc->txs)))
		tx_end(reg, rc, tx);
}
