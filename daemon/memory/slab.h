/*
 * Slabs: memfds shared by many small immutable host tensors of one access
 * class, so that the number of names is not bounded by the daemon's
 * descriptors (one per slab, not one per tensor) and a reader holds one
 * descriptor per slab it reads from.
 *
 * - A slab belongs to one access class (owner uid, gid, mode): whoever may
 *   read one of its tensors may read them all, so handing a reader the
 *   slab's descriptor shows it nothing it could not attach anyway.
 * - Only the daemon writes a slab, with pwrite() through its own O_RDWR
 *   descriptor, before the tensor is published. Readers get duplicates of
 *   an O_RDONLY descriptor, and the memfd is mode 0400, so a reader of
 *   another uid can neither write it nor reopen it for writing.
 * - Slots are SLAB_ALIGN-aligned. A freed slot is zeroed (holes punched,
 *   partial pages overwritten) before it can be reused, and it is freed
 *   only when the tensor is (after its last lease): no reader ever sees a
 *   slot's next tensor through an old lease, nor the bytes of its last.
 * - An empty slab is closed. Readers that still hold its descriptor keep
 *   the inode, not its pages (they were punched out).
 *
 * Everything runs on the loop thread.
 */
#ifndef TENSORD_SLAB_H
#define TENSORD_SLAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SLAB_SIZE (64u << 20)
#define SLAB_ALIGN 256u
/* The largest tensor a slab takes; larger ones get a memfd of their own. */
#define SLAB_MAX_ALLOC (64u << 10)

struct slab_class {
	uint32_t uid, gid, mode;
};

struct slab;
struct slab_pending;

struct slabs {
	struct slab *list; /* owned */
	uint64_t next_id;  /* ids are never reused */
	uint32_t n_slabs;
	uint64_t used; /* bytes in live slots, rounded to SLAB_ALIGN */
	/* Shutdown with the descriptor store on: freed slots keep their bytes,
	 * which the next daemon restores (docs/restart.md). */
	bool keep_contents;
	/*
	 * The descriptor store on: a slot freed during a commit step keeps its
	 * bytes until slabs_flush(), after the step's record is written, so a
	 * crash in between never restores a slot already zeroed. Pending
	 * slots stay taken until then.
	 */
	bool defer_frees;
	void (*on_close)(int fd);     /* a slab is about to close (backend_set_release_hook()) */
	struct slab_pending *pending; /* owned */
	size_t n_pending, cap_pending;
};

/* Zeroes and gives back the slots freed since the last flush (defer_frees). */
void slabs_flush(struct slabs *s);

void slabs_init(struct slabs *s);

/* Closes every slab, whatever is still allocated in it. */
void slabs_fini(struct slabs *s);

/*
 * A zeroed slot of size bytes (1 .. SLAB_MAX_ALLOC) in a slab of class cls.
 * *ret_slab is borrowed: valid until slab_free() of its last slot.
 * 0, -EINVAL (size), -ENOMEM, or -errno from making a new slab.
 */
int slab_alloc(struct slabs *s, const struct slab_class *cls, uint64_t size, struct slab **ret_slab,
	       uint64_t *ret_off);

/* Gives the slot at off of size bytes back (it is zeroed first; with defer_frees, at slabs_flush()). */
void slab_free(struct slabs *s, struct slab *sl, uint64_t off, uint64_t size);

/* Writes n bytes at off. 0 or -errno (-ENOSPC when tmpfs is full). */
int slab_write(struct slab *sl, uint64_t off, const void *data, size_t n);

/* A new read-only descriptor of the slab for a reader, owned by the caller, or -errno. */
int slab_export(struct slab *sl);

/* The slab's id: unique for the daemon's life, never 0. */
uint64_t slab_id(const struct slab *sl);

/* The slab's own descriptor (borrowed), for tests. */
int slab_fd(const struct slab *sl);

#endif /* TENSORD_SLAB_H */
