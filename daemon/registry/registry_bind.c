/*
 * Bindings (docs/design.md, "Attach without a round trip"): a lease a
 * client asked to bind gets a slot of its connection's binding page, a
 * small memfd the daemon maps and the client maps read-only. The slot
 * holds a generation while the lease's tensor is the one its name means;
 * the client then serves later attaches of that name from the lease it
 * holds, reading the slot instead of asking. The moment the name stops
 * meaning that tensor (unlink, replace, its creator's connection closing)
 * the slot is cleared, before whoever caused it hears back, so no attach
 * that starts after that can be served from it. A slot is also cleared
 * when its lease is released, and the page goes with the connection.
 *
 * The page has two halves. The first is the daemon's: slot generations
 * and the clear count. The second is the client's: slot i's word there
 * counts the local leases the binding serves in the client, which the
 * daemon reads only to report a tensor's refcount (registry_refcount()),
 * clamped, and never to decide what to free: a binding's lease keeps its
 * tensor until the client releases it, whatever the page says. The memfd
 * is sealed against shrinking, so no client can make the daemon's mapping
 * fault. A client that scribbles on its page misleads only itself and the
 * refcounts of what it holds.
 */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "daemon/figures.h"
#include "daemon/base/log.h"
#include "registry.h"
#include "registry_int.h"

struct reg_binding {
	struct tensor *t;             /* NULL: the slot is free */
	bool cleared;                 /* its word is 0: the name moved on; its lease lives */
	struct reg_client *rc;        /* borrowed: the page's */
	uint32_t lease_slot;          /* its lease: rc->leases[lease_slot] */
	uint32_t next_free;           /* 1-based: the next free slot; 0: none */
	uint32_t slot;                /* its own number */
	LIST_ENTRY(reg_binding) link; /* t->bindings */
};

/* Slots live in chunks that never move: tensors' lists link into them. */
#define CHUNK 256u

struct reg_page {
	int fd;
	_Atomic uint64_t *words; /* 2 * REG_PAGE_WORDS, mapped shared; word 0 counts clears */
	struct reg_binding *chunk[REG_PAGE_WORDS / CHUNK]; /* slot s: chunk[s / CHUNK][s % CHUNK] */
	uint32_t n;         /* slots handed out at least once (slot 0 is never one) */
	uint32_t free_head; /* 1-based; 0: none */
	uint32_t live;
	uint64_t next_gen;
	bool wake_due; /* clears since the last FUTEX_WAKE: on due_pages */
	LIST_ENTRY(reg_page) due_link;
};

/*
 * Pages whose clear count moved since their last wake. The wake itself
 * waits for registry_bind_wake(), which the loop calls a millisecond after
 * the first clear (main.c): waking the client's watcher thread only lets
 * go of memory sooner, and a wake onto another CPU costs the waker an IPI
 * (~15 us on a VM). Done inline it held up the publisher's reply and the
 * watchers' events; done before the loop slept, it still held up a
 * watcher the kernel had queued on the loop's CPU. Deferred, the clears of
 * a millisecond wake each page once.
 */
static LIST_HEAD(, reg_page) due_pages = LIST_HEAD_INITIALIZER(due_pages);

static struct reg_binding *slot_of(struct reg_page *p, uint32_t s)
{
	return &p->chunk[s / CHUNK][s % CHUNK];
}

/* The futex in word 0: the low 32 bits (both sides are little-endian here, as the wire is). */
static _Atomic uint32_t *clears_word(struct reg_page *p)
{
	return (_Atomic uint32_t *)(void *)p->words;
}

int registry_bind_page(struct reg_client *rc, int *ret_fd, uint32_t *ret_words, char *why,
		       size_t why_len)
{
	struct reg_page *p = rc->page;
	size_t size = 2 * REG_PAGE_WORDS * sizeof(uint64_t);
	int fd, e;
	void *m;

	if (p) {
		*ret_fd = p->fd;
		*ret_words = REG_PAGE_WORDS;
		return 0;
	}
	fd = memfd_create("tensord-bindings", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		e = -errno;
		snprintf(why, why_len, "binding page: memfd_create failed: %s", strerror(errno));
		return e;
	}
	if (ftruncate(fd, (off_t)size) < 0) {
		e = -errno;
		snprintf(why, why_len, "binding page: ftruncate to %zu bytes failed: %s", size,
			 strerror(errno));
		close(fd);
		return e;
	}
	m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		e = -errno;
		snprintf(why, why_len, "binding page: mmap failed: %s", strerror(errno));
		close(fd);
		return e;
	}
	/* A client that could shrink it would make our reads of it fault. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		e = -errno;
		snprintf(why, why_len, "binding page: sealing its size failed: %s",
			 strerror(errno));
		munmap(m, size);
		close(fd);
		return e;
	}
	p = calloc(1, sizeof(*p));
	if (!p) {
		snprintf(why, why_len, "binding page: out of memory");
		munmap(m, size);
		close(fd);
		return -ENOMEM;
	}
	p->fd = fd;
	p->words = m;
	rc->page = p;
	*ret_fd = fd;
	*ret_words = REG_PAGE_WORDS;
	figure_count(FIG_binding_pages_total, 1);
	return 0;
}

/*
 * The name no longer means slot s's tensor: its word goes to 0 (release:
 * a client that reads 0 sees nothing older) and the clear count grows, now;
 * a client thread sleeping on the count wakes at registry_bind_wake(). The
 * slot stays the binding's until its lease ends: the client's count there
 * still counts its local leases.
 */
static void slot_clear(struct reg_page *p, uint32_t s)
{
	atomic_store_explicit(&p->words[s], 0, memory_order_release);
	slot_of(p, s)->cleared = true;
	atomic_fetch_add_explicit(clears_word(p), 1, memory_order_release);
	if (!p->wake_due) {
		p->wake_due = true;
		LIST_INSERT_HEAD(&due_pages, p, due_link);
	}
	figure_count(FIG_bindings_cleared_total, 1);
}

bool registry_bind_due(void)
{
	return !LIST_EMPTY(&due_pages);
}

unsigned registry_bind_wake(void)
{
	struct reg_page *p;
	unsigned n = 0;

	while ((p = LIST_FIRST(&due_pages))) {
		LIST_REMOVE(p, due_link);
		p->wake_due = false;
		/* No one waiting costs one syscall. */
		syscall(SYS_futex, clears_word(p), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
		n++;
	}
	return n;
}

/* Slot s is free again: its lease ended. */
static void slot_free(struct reg_page *p, uint32_t s)
{
	struct reg_binding *b = slot_of(p, s);

	atomic_store_explicit(&p->words[s], 0, memory_order_release);
	atomic_store_explicit(&p->words[REG_PAGE_WORDS + s], 0, memory_order_relaxed);
	LIST_REMOVE(b, link);
	b->rc->leases[b->lease_slot].bind_slot = 0;
	b->t = NULL;
	b->next_free = p->free_head;
	p->free_head = s;
	p->live--;
}

bool registry_bind(struct reg_client *rc, uint64_t lease, uint32_t *ret_slot, uint64_t *ret_gen)
{
	struct reg_page *p = rc->page;
	uint32_t ls = (uint32_t)lease - 1, s;
	struct tensor *t;

	if (!p || (uint32_t)lease == 0 || ls >= rc->n_slots || !rc->leases[ls].t ||
	    rc->leases[ls].bind_slot)
		return false;
	t = rc->leases[ls].t;
	if (t->state != TENSORD_STATE_PUBLISHED)
		return false;
	if (p->free_head) {
		s = p->free_head;
		p->free_head = slot_of(p, s)->next_free;
	} else {
		if (p->n + 1 >= REG_PAGE_WORDS)
			return false; /* full: this attach is not bound */
		if (!p->chunk[(p->n + 1) / CHUNK]) {
			p->chunk[(p->n + 1) / CHUNK] = calloc(CHUNK, sizeof(struct reg_binding));
			if (!p->chunk[(p->n + 1) / CHUNK])
				return false;
		}
		s = ++p->n;
	}
	*slot_of(p, s) = (struct reg_binding){ .t = t, .rc = rc, .lease_slot = ls, .slot = s };
	atomic_store_explicit(&p->words[REG_PAGE_WORDS + s], 0, memory_order_relaxed);
	LIST_INSERT_HEAD(&t->bindings, slot_of(p, s), link);
	rc->leases[ls].bind_slot = s;
	p->live++;
	*ret_gen = ++p->next_gen;
	*ret_slot = s;
	atomic_store_explicit(&p->words[s], *ret_gen, memory_order_release);
	figure_count(FIG_bindings_total, 1);
	return true;
}

void reg_bindings_clear(struct tensor *t)
{
	struct reg_binding *b;

	LIST_FOREACH(b, &t->bindings, link)
	{
		if (!b->cleared)
			slot_clear(b->rc->page, b->slot);
	}
}

void reg_binding_end(struct reg_client *rc, uint32_t lease_slot)
{
	uint32_t s = rc->leases[lease_slot].bind_slot;

	if (s)
		slot_free(rc->page, s);
}

void reg_bindings_detach(struct tensor *t)
{
	struct reg_binding *b;

	while ((b = LIST_FIRST(&t->bindings)))
		slot_free(b->rc->page, b->slot);
}

uint32_t registry_lease_weight(const struct reg_client *rc, uint32_t lease_slot)
{
	uint32_t s = rc->leases[lease_slot].bind_slot;
	uint64_t local;

	if (!s)
		return 1;
	local = atomic_load_explicit(&rc->page->words[REG_PAGE_WORDS + s], memory_order_relaxed);
	return local > INT32_MAX ? INT32_MAX : (uint32_t)local;
}

uint32_t registry_refcount(const struct tensor *t)
{
	int64_t n = t->refcount;
	struct reg_binding *b;

	/* A bound lease counts as the local leases its client says it serves. */
	LIST_FOREACH(b, &t->bindings, link)
	{
		uint64_t local = atomic_load_explicit(&b->rc->page->words[REG_PAGE_WORDS + b->slot],
						      memory_order_relaxed);

		n += (int64_t)(local > INT32_MAX ? INT32_MAX : local) - 1;
	}
	return n < 0 ? 0 : n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

void reg_page_free(struct reg_client *rc)
{
	struct reg_page *p = rc->page;

	if (!p)
		return;
	/* Its leases ended first (registry_client_gone()), and with them its slots. */
	if (p->wake_due)
		LIST_REMOVE(p, due_link); /* its client is gone: no one to wake */
	munmap((void *)p->words, 2 * REG_PAGE_WORDS * sizeof(uint64_t));
	close(p->fd);
	for (uint32_t i = 0; i < REG_PAGE_WORDS / CHUNK; i++)
		free(p->chunk[i]);
	free(p);
	rc->page = NULL;
}

uint32_t registry_bindings(const struct reg_client *rc)
{
	return rc->page ? rc->page->live : 0;
}
