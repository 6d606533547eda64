/*
 * DLPack plumbing that never touches Python: shares of foreign tensors,
 * legacy wrappers and private copies. Everything here may run on any
 * thread, without the GIL, and during or after interpreter shutdown,
 * because consumers call these deleters from wherever their arrays die.
 */
#include "tdpy.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

size_t td_itemsize(DLDataType dt)
{
	size_t bits = (size_t)dt.bits * (dt.lanes ? dt.lanes : 1);

	return bits % 8 ? 0 : bits / 8;
}

/*
 * A tensor from another producer, shared by reference count: the tensor
 * returned by the exchange table's managed_tensor_to_py_object_no_sync is
 * not libtensord's, so tensord_share() cannot split it.
 */
struct foreign_root {
	atomic_uint refs;
	DLManagedTensorVersioned *orig; /* owned; its deleter runs at refs == 0 */
};

struct foreign_share {
	DLManagedTensorVersioned mt; /* first, so &share->mt == share */
	struct foreign_root *root;
};

static void foreign_deleter(DLManagedTensorVersioned *self)
{
	struct foreign_share *s = (struct foreign_share *)self;
	struct foreign_root *root = s->root;

	free(s);
	if (atomic_fetch_sub_explicit(&root->refs, 1, memory_order_acq_rel) == 1) {
		if (root->orig->deleter)
			root->orig->deleter(root->orig);
		free(root);
	}
}

static int foreign_share_new(struct foreign_root *root, DLManagedTensorVersioned **ret)
{
	struct foreign_share *s = malloc(sizeof(*s));

	if (!s)
		return -ENOMEM;
	s->mt = *root->orig;
	s->mt.version.major = DLPACK_MAJOR_VERSION;
	s->mt.version.minor = DLPACK_MINOR_VERSION;
	s->mt.manager_ctx = s;
	s->mt.deleter = foreign_deleter;
	s->root = root;
	atomic_fetch_add_explicit(&root->refs, 1, memory_order_relaxed);
	*ret = &s->mt;
	return 0;
}

int td_foreign_wrap(DLManagedTensorVersioned *orig, DLManagedTensorVersioned **ret)
{
	struct foreign_root *root = malloc(sizeof(*root));
	int rc;

	if (!root) {
		if (orig->deleter)
			orig->deleter(orig);
		return -ENOMEM;
	}
	atomic_init(&root->refs, 0);
	root->orig = orig;
	rc = foreign_share_new(root, ret);
	if (rc < 0) {
		if (orig->deleter)
			orig->deleter(orig);
		free(root);
	}
	return rc;
}

bool td_is_foreign(const DLManagedTensorVersioned *t)
{
	return t->deleter == foreign_deleter;
}

int td_share(DLManagedTensorVersioned *t, DLManagedTensorVersioned **ret)
{
	if (t->deleter == foreign_deleter)
		return foreign_share_new(((struct foreign_share *)t)->root, ret);
	return tensord_share(t, ret);
}

/* --- legacy wrappers ---------------------------------------------------- */

struct legacy {
	DLManagedTensor lt;              /* first, so &l->lt == l */
	DLManagedTensorVersioned *inner; /* owned; shape and strides point into it */
};

static void legacy_deleter(DLManagedTensor *self)
{
	struct legacy *l = (struct legacy *)self;

	if (l->inner->deleter)
		l->inner->deleter(l->inner);
	free(l);
}

DLManagedTensor *td_legacy_wrap(DLManagedTensorVersioned *t)
{
	struct legacy *l = malloc(sizeof(*l));

	if (!l) {
		if (t->deleter)
			t->deleter(t);
		return NULL;
	}
	l->lt.dl_tensor = t->dl_tensor;
	l->lt.manager_ctx = l;
	l->lt.deleter = legacy_deleter;
	l->inner = t;
	return &l->lt;
}

/* --- private host tensors ----------------------------------------------- */

struct host_tensor {
	DLManagedTensorVersioned mt; /* first */
	void *data;                  /* owned; free()d with the struct */
	int64_t dims[];              /* shape, then strides: 2 * ndim entries */
};

static void host_deleter(DLManagedTensorVersioned *self)
{
	struct host_tensor *h = (struct host_tensor *)self;

	free(h->data);
	free(h);
}

/*
 * Copies dimension dim onwards of a strided source into a compact
 * destination; sstr and dstr are in bytes. The innermost dimension becomes
 * one memcpy when the source is contiguous there.
 */
static void copy_dims(char *dst, const char *src, int dim, int ndim, const int64_t *shape,
		      const int64_t *sstr, const int64_t *dstr, size_t item)
{
	if (dim == ndim) {
		memcpy(dst, src, item);
		return;
	}
	if (dim == ndim - 1 && sstr[dim] == (int64_t)item) {
		memcpy(dst, src, (size_t)shape[dim] * item);
		return;
	}
	for (int64_t i = 0; i < shape[dim]; i++)
		copy_dims(dst + i * dstr[dim], src + i * sstr[dim], dim + 1, ndim, shape, sstr,
			  dstr, item);
}

int td_host_tensor(const DLTensor *like, bool copy, uint64_t flags, DLManagedTensorVersioned **ret)
{
	size_t item = td_itemsize(like->dtype);
	int ndim = like->ndim;
	uint64_t count = 1;
	struct host_tensor *h;
	int64_t sstr[TENSORD_NDIM_MAX], dstr[TENSORD_NDIM_MAX];

	if (item == 0 || ndim < 0 || ndim > TENSORD_NDIM_MAX || (ndim > 0 && !like->shape))
		return -EINVAL;
	for (int i = 0; i < ndim; i++) {
		if (like->shape[i] < 0 ||
		    __builtin_mul_overflow(count, (uint64_t)like->shape[i], &count))
			return -EINVAL;
	}
	if (__builtin_mul_overflow(count, (uint64_t)item, &count) || count > SIZE_MAX / 2)
		return -EINVAL;

	h = malloc(sizeof(*h) + 2 * (size_t)ndim * sizeof(int64_t));
	if (!h)
		return -ENOMEM;
	/* One byte at least, so that data is never NULL, even for zero-size tensors. */
	if (posix_memalign(&h->data, 256, count ? (size_t)count : 1) != 0) {
		free(h);
		return -ENOMEM;
	}
	memset(&h->mt, 0, sizeof(h->mt));
	h->mt.version.major = DLPACK_MAJOR_VERSION;
	h->mt.version.minor = DLPACK_MINOR_VERSION;
	h->mt.manager_ctx = h;
	h->mt.deleter = host_deleter;
	h->mt.flags = flags;
	h->mt.dl_tensor.data = h->data;
	h->mt.dl_tensor.device = (DLDevice){ kDLCPU, 0 };
	h->mt.dl_tensor.ndim = ndim;
	h->mt.dl_tensor.dtype = like->dtype;
	h->mt.dl_tensor.shape = ndim ? h->dims : NULL;
	h->mt.dl_tensor.strides = ndim ? h->dims + ndim : NULL;
	h->mt.dl_tensor.byte_offset = 0;

	/* Row-major compact; size-0 and size-1 dimensions get the canonical stride too. */
	for (int64_t i = ndim - 1, step = 1; i >= 0; i--) {
		h->dims[i] = like->shape[i];
		h->dims[ndim + i] = step;
		step *= like->shape[i] > 1 ? like->shape[i] : 1;
	}

	if (copy && count > 0) {
		for (int i = 0; i < ndim; i++) {
			int64_t s = like->strides ? like->strides[i] : h->dims[ndim + i];

			sstr[i] = s * (int64_t)item;
			dstr[i] = h->dims[ndim + i] * (int64_t)item;
		}
		copy_dims(h->data, (const char *)like->data + like->byte_offset, 0, ndim, h->dims,
			  sstr, dstr, item);
	}
	*ret = &h->mt;
	return 0;
}
