/*
 * Versions of names (docs/design.md, "Versions, sets and watches"): the
 * commit steps that change what names mean, the generation each publish
 * gets, and the tombstones that remember the last generation of unlinked
 * names so that (name, generation) is never reused.
 *
 * A step is what one request (or a closing connection) does in one pass of
 * the loop: its changes are collected as they happen and handed to
 * on_commit once, at reg_step_end(), so whoever listens (waiters, watches)
 * sees a whole step or nothing of it.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/base/log.h"
#include "registry_int.h"

/* One unlinked name's last generation. */
struct reg_tomb {
	RB_ENTRY(reg_tomb) byname;
	TAILQ_ENTRY(reg_tomb) age; /* oldest first: the first to go */
	uint64_t generation, commit;
	uint32_t owner_uid, owner_gid, mode;
	const char *name; /* in buf[] (a lookup's key points elsewhere) */
	size_t name_len;
	char buf[];
};

static int cmp_tombs(const struct reg_tomb *a, const struct reg_tomb *b)
{
	return strcmp(a->name, b->name);
}

RB_GENERATE_STATIC(reg_tombs, reg_tomb, byname, cmp_tombs)

static struct reg_tomb *tomb_find(struct registry *reg, const char *name)
{
	struct reg_tomb key = { .name = name };

	return RB_FIND(reg_tombs, &reg->tombs, &key);
}

static void tomb_free(struct registry *reg, struct reg_tomb *tb)
{
	RB_REMOVE(reg_tombs, &reg->tombs, tb);
	TAILQ_REMOVE(&reg->tomb_age, tb, age);
	reg->n_tombs--;
	free(tb);
}

void reg_versions_init(struct registry *reg)
{
	RB_INIT(&reg->tombs);
	TAILQ_INIT(&reg->tomb_age);
	reg->next_commit = 1;
	reg->tombs_max = REGISTRY_TOMBS_MAX;
}

void reg_versions_fini(struct registry *reg)
{
	struct reg_tomb *tb;

	while ((tb = TAILQ_FIRST(&reg->tomb_age)))
		tomb_free(reg, tb);
	free(reg->changes);
	reg->changes = NULL;
	reg->n_changes = reg->cap_changes = 0;
}

/*
 * Forgets the oldest tombstone: every name the daemon does not remember
 * starts above its generation from now on.
 */
static void tomb_evict(struct registry *reg)
{
	struct reg_tomb *tb = TAILQ_FIRST(&reg->tomb_age);

	if (tb->generation > reg->gen_floor)
		reg->gen_floor = tb->generation;
	tomb_free(reg, tb);
}

/* name (len bytes, NUL-terminated) loses its name for good at generation: remember it. */
static void tomb_put(struct registry *reg, const char *name, size_t len, uint64_t generation,
		     uint64_t commit, uint32_t uid, uint32_t gid, uint32_t mode)
{
	struct reg_tomb *tb = tomb_find(reg, name);

	if (tb) /* the name's older tombstone: t was published over it */
		tomb_free(reg, tb);
	while (reg->n_tombs && reg->n_tombs >= reg->tombs_max)
		tomb_evict(reg);
	tb = reg->tombs_max ? malloc(sizeof(*tb) + len + 1) : NULL;
	if (!tb) {
		/* Out of memory (or no table): the floor remembers for every name. */
		if (generation > reg->gen_floor)
			reg->gen_floor = generation;
		return;
	}
	tb->generation = generation;
	tb->commit = commit;
	tb->owner_uid = uid;
	tb->owner_gid = gid;
	tb->mode = mode;
	tb->name_len = len;
	memcpy(tb->buf, name, len);
	tb->buf[len] = '\0';
	tb->name = tb->buf;
	RB_INSERT(reg_tombs, &reg->tombs, tb);
	TAILQ_INSERT_TAIL(&reg->tomb_age, tb, age);
	reg->n_tombs++;
}

/* t, published and named, loses its name for good: remember its generation. */
static void tomb_add(struct registry *reg, const struct tensor *t, uint64_t commit)
{
	tomb_put(reg, t->name, t->name_len, t->generation, commit, t->owner_uid, t->owner_gid,
		 t->mode);
}

void registry_restore_versions(struct registry *reg, uint64_t next_commit, uint64_t gen_floor)
{
	if (next_commit > reg->next_commit)
		reg->next_commit = next_commit;
	if (gen_floor > reg->gen_floor)
		reg->gen_floor = gen_floor;
}

void registry_restore_tomb(struct registry *reg, const char *name, size_t len, uint64_t generation,
			   uint64_t commit, uint32_t uid, uint32_t gid, uint32_t mode)
{
	char key[TENSORD_NAME_MAX + 1];

	if (len > TENSORD_NAME_MAX || !generation)
		return;
	memcpy(key, name, len);
	key[len] = '\0';
	tomb_put(reg, key, len, generation, commit, uid, gid, mode);
}

/* --- steps ------------------------------------------------------------------------ */

int reg_step_reserve(struct registry *reg, size_t n)
{
	size_t want = reg->n_changes + n, cap = reg->cap_changes;
	struct reg_change *nv;

	if (want <= cap)
		return 0;
	while (cap < want)
		cap = cap ? 2 * cap : 16;
	nv = realloc(reg->changes, cap * sizeof(*nv));
	if (!nv)
		return -ENOMEM;
	reg->changes = nv;
	reg->cap_changes = cap;
	return 0;
}

uint64_t reg_step_commit(struct registry *reg)
{
	if (!reg->step_commit)
		reg->step_commit = reg->next_commit++;
	return reg->step_commit;
}

/* A change of this step, or NULL when there is no room (reg_step_reserve() failed). */
static struct reg_change *change(struct registry *reg, const struct tensor *t,
				 enum reg_change_kind kind)
{
	struct reg_change *c;

	if (reg_step_reserve(reg, 1) < 0) {
		reg->step_lost = true;
		return NULL;
	}
	c = &reg->changes[reg->n_changes++];
	c->kind = kind;
	c->generation = t->generation;
	c->commit = t->commit;
	c->owner_uid = t->owner_uid;
	c->owner_gid = t->owner_gid;
	c->mode = t->mode;
	c->tensor = kind == REG_PUBLISHED ? t : NULL;
	c->retired = NULL;
	c->name_len = t->name_len;
	memcpy(c->name, t->name, t->name_len + 1);
	return c;
}

void reg_step_published(struct registry *reg, struct tensor *t, uint64_t replaced_gen,
			struct tensor *retired)
{
	struct reg_tomb *tb = replaced_gen ? NULL : tomb_find(reg, t->name);
	uint64_t last = replaced_gen ? replaced_gen : tb ? tb->generation : reg->gen_floor;
	struct reg_change *c;

	assert(t->state == TENSORD_STATE_PUBLISHED && !t->generation);
	if (tb)
		tomb_free(reg, tb);
	t->generation = last + 1;
	t->commit = reg_step_commit(reg);
	c = change(reg, t, REG_PUBLISHED);
	if (c)
		c->retired = retired;
}

void reg_step_unlinked(struct registry *reg, struct tensor *t)
{
	uint64_t commit = reg_step_commit(reg);
	struct reg_change *c;

	assert(t->generation);
	tomb_add(reg, t, commit);
	c = change(reg, t, REG_UNLINKED);
	if (c) {
		c->commit = commit;
		/* Its leases keep it once its name goes (reg_tensor_unlink()). */
		c->retired = t->refcount ? t : NULL;
	}
}

void reg_step_end(struct registry *reg)
{
	struct reg_change *v = reg->changes;
	size_t n = reg->n_changes, cap = reg->cap_changes;
	bool lost = reg->step_lost;

	reg->step_commit = 0;
	reg->step_lost = false;
	if (!n && !lost)
		return;
	/* The listeners get the step's changes to themselves: what they do may
	 * make a step of its own (answering a waiter can close a connection,
	 * whose tensors go), which collects into a buffer of its own. */
	reg->changes = NULL;
	reg->n_changes = reg->cap_changes = 0;
	if (reg->on_commit)
		reg->on_commit(reg->on_commit_ctx, v, n, lost);
	if (!reg->changes) {
		reg->changes = v;
		reg->cap_changes = cap;
	} else {
		free(v);
	}
}

/* --- what the tombstones know ---------------------------------------------------- */

bool registry_tomb(struct registry *reg, const struct reg_client *rc, const char *name, size_t len,
		   uint64_t *ret_generation, uint64_t *ret_commit)
{
	char key[TENSORD_NAME_MAX + 1];
	struct reg_tomb *tb;

	if (len > TENSORD_NAME_MAX)
		return false;
	memcpy(key, name, len);
	key[len] = '\0';
	tb = tomb_find(reg, key);
	if (!tb || !registry_may_hear(tb->owner_uid, tb->owner_gid, tb->mode, rc))
		return false;
	*ret_generation = tb->generation;
	*ret_commit = tb->commit;
	return true;
}

uint64_t registry_tombs_newest(struct registry *reg, const struct reg_client *rc,
			       const char *prefix, size_t len)
{
	char key_name[TENSORD_NAME_MAX + 1];
	struct reg_tomb key = { .name = key_name }, *tb;
	uint64_t newest = 0;

	if (len > TENSORD_NAME_MAX)
		return 0;
	memcpy(key_name, prefix, len);
	key_name[len] = '\0';
	for (tb = RB_NFIND(reg_tombs, &reg->tombs, &key); tb;
	     tb = RB_NEXT(reg_tombs, &reg->tombs, tb)) {
		if (tb->name_len < len || memcmp(tb->name, prefix, len) != 0)
			break;
		if (tb->commit > newest &&
		    registry_may_hear(tb->owner_uid, tb->owner_gid, tb->mode, rc))
			newest = tb->commit;
	}
	return newest;
}

void registry_tombs_each(struct registry *reg, const char *prefix, size_t len,
			 void (*fn)(void *arg, const struct reg_change *c), void *arg)
{
	char key_name[TENSORD_NAME_MAX + 1];
	struct reg_tomb key = { .name = key_name };
	struct reg_change c;

	if (len > TENSORD_NAME_MAX)
		return;
	memcpy(key_name, prefix, len);
	key_name[len] = '\0';
	for (struct reg_tomb *tb = RB_NFIND(reg_tombs, &reg->tombs, &key); tb;
	     tb = RB_NEXT(reg_tombs, &reg->tombs, tb)) {
		if (tb->name_len < len || memcmp(tb->name, prefix, len) != 0)
			break;
		c = (struct reg_change){ .kind = REG_UNLINKED,
					 .generation = tb->generation,
					 .commit = tb->commit,
					 .owner_uid = tb->owner_uid,
					 .owner_gid = tb->owner_gid,
					 .mode = tb->mode,
					 .name_len = tb->name_len };
		memcpy(c.name, tb->name, tb->name_len + 1);
		fn(arg, &c);
	}
}
