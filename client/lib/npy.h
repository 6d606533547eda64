/*
 * Reading and writing NumPy .npy files, for libtensord's checkpoint files
 * (file_import.c, file_export.c).
 *
 * What is handled: format versions 1.0, 2.0 and 3.0; the dtypes bool, int8..
 * int64, uint8..uint64, float16/32/64 and complex64/128 in little-endian or
 * native byte order; C and Fortran order; 0-d and zero-size arrays; up to
 * TENSORD_NDIM_MAX dimensions. Everything else (big-endian, object, string,
 * structured and sub-array dtypes, pickled data) is refused with a reason.
 *
 * Conventions:
 *  - Functions return 0 (or a size) on success and a negative errno value on
 *    failure: -EINVAL for a malformed file, -ENOTSUP for a well-formed file
 *    this code does not handle, -EMSGSIZE for a header over NPY_HEADER_MAX,
 *    -ENODATA for a file shorter than its header says, or the errno of a
 *    failed system call.
 *  - On failure, err (errlen bytes, may be NULL) receives a one-line reason
 *    without the file name ("unsupported dtype '>f4': big-endian"); callers
 *    prefix the name.
 *  - Nothing here allocates memory the caller must free, and nothing maps a
 *    file: a file that shrinks while it is read is an error, not SIGBUS.
 */
#ifndef TENSORD_CLIENT_NPY_H
#define TENSORD_CLIENT_NPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

#include <tensord/tensord.h>

/* "\x93NUMPY": every .npy file starts with these six bytes. */
#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6

/*
 * The longest header we read, preamble included. numpy refuses headers over
 * 10000 bytes by default for safety; 32 dimensions need well under 1000.
 */
#define NPY_HEADER_MAX 65536

/* Alignment numpy pads the header to, so the data is aligned in a mapping. */
#define NPY_ALIGN 64

/* A parsed header. Plain data, owned by the caller; nothing to free. */
struct npy_header {
	uint8_t version_major; /* 1, 2 or 3 */
	uint8_t version_minor; /* 0 */
	DLDataType dtype;
	size_t itemsize; /* bytes per element */
	bool fortran_order;
	int32_t ndim; /* 0 .. TENSORD_NDIM_MAX */
	int64_t shape[TENSORD_NDIM_MAX];
	uint64_t count;       /* elements: product of shape (1 for 0-d) */
	uint64_t data_offset; /* bytes before the data: preamble plus header */
	uint64_t data_bytes;  /* count * itemsize, checked for overflow */
	char descr[32];       /* the dtype as the file spelled it, for messages */
};

/*
 * Maps a .npy descr string ("<f4", "|b1", "=i8", "bool", "float32") to a
 * DLPack dtype. -ENOTSUP, with the reason in err, for everything else.
 */
int npy_descr_parse(const char *descr, DLDataType *ret_dtype, char *err, size_t errlen);

/*
 * Writes the little-endian (host order) descr of dt ("<f4", "|b1") into buf.
 * -ENOTSUP for dtypes numpy has no name for (bfloat16, float8, vectors).
 */
int npy_descr_format(DLDataType dt, char *buf, size_t len, char *err, size_t errlen);

/*
 * Writes a readable name of dt ("float32", "bfloat16", "dtype(7,8,1)") into
 * buf and returns buf. Used in messages; does not need the client library.
 */
const char *npy_dtype_str(DLDataType dt, char *buf, size_t len);

/*
 * How many bytes the preamble at buf says the whole header takes (magic,
 * version, length field and header text): the offset of the data. len must
 * be at least 12 (NPY_PREAMBLE_MAX) or the file's size if smaller. -EINVAL
 * (bad magic, unknown version), -ENODATA (shorter than a preamble),
 * -EMSGSIZE (over NPY_HEADER_MAX).
 */
#define NPY_PREAMBLE_MAX 12
int64_t npy_header_size(const void *buf, size_t len, char *err, size_t errlen);

/*
 * Parses the header at the start of buf (len bytes, at least the whole
 * header; the data may follow or not) into *ret. Pure: no I/O. The data
 * itself is not checked against len; see npy_open_fd() for that.
 */
int npy_parse_header(const void *buf, size_t len, struct npy_header *ret, char *err, size_t errlen);

/*
 * Reads and parses the header from f, leaving f at the first data byte.
 * Borrowed: f, only for the call. Allocates a temporary buffer of at most
 * NPY_HEADER_MAX bytes and frees it before returning; nothing for the
 * caller to free.
 */
int npy_read_header(FILE *f, struct npy_header *ret, char *err, size_t errlen);

/*
 * Fills strides (ndim entries, in elements) with the layout the file's data
 * has: row-major compact, or column-major compact when fortran_order.
 */
void npy_header_strides(const struct npy_header *h, int64_t *strides);

/*
 * 0 when st (of the file a user named) is a regular file, else -EINVAL with
 * what it is in err ("is a FIFO (named pipe), not a regular file"). Lets a
 * caller refuse a FIFO or a device before an open() that could block or
 * act on it.
 */
int npy_regular(const struct stat *st, char *err, size_t errlen);

/*
 * Reads and parses the header of the .npy file open on fd into *ret, and
 * checks that the file is regular and holds all the data the header
 * promises. Borrowed: fd, only for the call; reads with pread(), so the
 * file offset does not move. Nothing to release.
 */
int npy_open_fd(int fd, struct npy_header *ret, char *err, size_t errlen);

/*
 * Reads the data of the file open on fd, whose header npy_open_fd() gave
 * as h, into dst (h->data_bytes bytes, caller-owned): one copy, straight
 * from the page cache. A file that shrank since npy_open_fd() is -ENODATA,
 * "file shrank while reading (N of M bytes)"; dst then holds N bytes.
 */
int npy_read_data(int fd, const struct npy_header *h, void *dst, char *err, size_t errlen);

/*
 * Formats a version 1.0 header (preamble included, padded with spaces to
 * NPY_ALIGN bytes, ending in '\n') for a C-order array of dtype dt and the
 * given shape into buf. Returns its length, or -ENOTSUP (dtype), -EINVAL
 * (ndim or shape), -ENOSPC (len too small; 4096 is always enough).
 */
int npy_format_header(DLDataType dt, int32_t ndim, const int64_t *shape, bool fortran_order,
		      char *buf, size_t len, char *err, size_t errlen);

/*
 * Writes t, which must be in host-accessible memory (td_device_host_accessible),
 * to f as a C-order .npy file: header, then the elements in row-major order
 * whatever t's strides (NULL strides: row-major compact; negative and zero
 * strides are fine). Borrowed: f and t, only for the call; f is neither
 * flushed nor closed. -EIO with errno's reason in err when a write fails.
 */
int npy_write(FILE *f, const DLTensor *t, char *err, size_t errlen);

/*
 * Writes the elements of t (host memory, at least one element, a dtype of
 * whole bytes: bits * lanes a multiple of 8) to f in row-major order,
 * whatever its strides: the data part of npy_write(), also what a
 * .safetensors holds. Borrowed: f and t, only for the call. 0, or -EIO /
 * -ENOMEM with the reason in err.
 */
int npy_write_elements(FILE *f, const DLTensor *t, char *err, size_t errlen);

/*
 * For npy*.c: writes the reason (printf-style) into err when err is not
 * NULL, and returns rc.
 */
int npy_fail(int rc, char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#endif /* TENSORD_CLIENT_NPY_H */
