/*
 * Tensor descriptors: names, dtypes, devices, shapes and strides, checked the
 * same way by the daemon (which decides) and the client library (which
 * fails early with the same words). Pure functions, no I/O.
 */
#ifndef TENSORD_DESC_H
#define TENSORD_DESC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tensord/tensord.h>

/* The most bytes one tensor may have: keeps every size sum far from overflow. */
#define TD_BYTES_MAX (UINT64_C(1) << 56)

/*
 * 0 if name (len bytes, not necessarily NUL-terminated) is a valid tensor
 * name, else -EINVAL with the reason in why.
 */
int td_name_check(const char *name, size_t len, char *why, size_t why_len);

/*
 * 0 if label is a valid connection label (1 to TENSORD_LABEL_MAX bytes of
 * printable ASCII without spaces), else -EINVAL with the reason in why.
 */
int td_label_check(const char *label, char *why, size_t why_len);

/*
 * 0 if name (len bytes) names a tensor of another node (docs/remote.md,
 * "Naming"): "@PEER/NAME", PEER 1-63 bytes of [A-Za-z0-9._-] and NAME a
 * valid name, the whole at most TENSORD_NAME_MAX bytes; *ret_peer_len is
 * PEER's length. Else -EINVAL with the reason in why.
 */
int td_remote_name_check(const char *name, size_t len, size_t *ret_peer_len, char *why,
			 size_t why_len);

/* 0 if dt is a DLPack type we can size, else -EINVAL with the reason. */
int td_dtype_check(DLDataType dt, char *why, size_t why_len);

/*
 * Checks a shape and optional strides (in elements) and computes the bytes
 * an allocation needs so that every element is inside it. ret_strides gets
 * the strides to use (the given ones, or row-major compact). -EINVAL with
 * the reason on a bad rank, negative extent, negative stride, or overflow;
 * -EFBIG when the tensor is larger than TD_BYTES_MAX.
 */
int td_layout(DLDataType dt, int32_t ndim, const int64_t *shape, const int64_t *strides,
	      int64_t *ret_strides, uint64_t *ret_nbytes, char *why, size_t why_len);

/*
 * The one check of a descriptor's rank, wherever a descriptor comes from
 * outside (a client's Create, a peer's pull reply, a caller's put() or
 * tensord_spec), before anything reads its arrays: ndim (a wire count, or a
 * caller's signed int) is 0 to TENSORD_NDIM_MAX, and n_strides is one per
 * dimension, or 0 (none: compact) unless strides_required. 0, else -EINVAL
 * with the reason. td_layout() checks the extents and strides themselves.
 */
int td_ndim_check(int64_t ndim, size_t n_strides, bool strides_required, char *why, size_t why_len);

/*
 * A descriptor from the wire (a Create, a peer's pull reply or name list):
 * its dtype's three fields as the wire carries them (uint32), which must fit
 * DLDataType's (code and bits 8 bits, lanes 16) and give bits and lanes of at
 * least 1, and its counts as td_ndim_check() takes them. 0 with *ret_dt the
 * dtype, else -EINVAL with the reason. What is left for td_layout(): the
 * dtype's code and the shape's and strides' values.
 */
int td_desc_from_wire(uint32_t code, uint32_t bits, uint32_t lanes, size_t n_shape,
		      size_t n_strides, bool strides_required, DLDataType *ret_dt, char *why,
		      size_t why_len);

/* Bytes of one element, rounded up; 0 for sub-byte types. */
uint64_t td_dtype_size(DLDataType dt);

/*
 * Whether the CPU can read memory of this device type through its plain
 * address: host memory, and a GPU vendor's pinned host memory and managed
 * memory (its row's host types, common/vendor.h). The one answer to that
 * question for put(), the Python module and tensorctl.
 */
bool td_device_host_accessible(DLDeviceType type);

/* Whether tensord allocates on this device type itself: a GPU vendor's (cuda:N, rocm:N). */
bool td_device_is_gpu(DLDeviceType type);

/* Writes a printable, quoted form of an untrusted name (escapes odd bytes). */
const char *td_name_quote(const char *name, size_t len, char *buf, size_t buf_len);

#endif
