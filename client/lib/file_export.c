/*
 * tensord_get_file(): tensors written as one .safetensors, .npz or .npy
 * file, all of them leased in one daemon step (tensord_attach_many()), so
 * the file holds one consistent commit even while a writer republishes.
 *
 * .safetensors: 8-byte little-endian header length, the JSON header
 * (dtype, shape, data_offsets of each tensor; __metadata__ with the
 * commit), padded with spaces to 8 bytes as the crate pads it, then the
 * data, row-major. .npz: a zip (written by libzip, members stored, no
 * compression) of NAME.npy members as numpy.savez writes them. .npy: one
 * tensor, as npy_write() writes it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <zip.h>

#include "file.h"
#include "import.h"
#include "npy.h"

/* One tensor to write. */
struct member {
	const char *name; /* in the file (borrowed from the set or the caller) */
	const char *full; /* its tensord name, for messages */
	const DLTensor *t;
	const char *st; /* safetensors dtype */
	int st_lanes;
	uint64_t nbytes; /* row-major compact */
};

struct export
{
	const char *path;
	tensord_file_format fmt;
	struct member *m;
	size_t n;
	uint64_t commit;
	tensord_set *set;
	DLManagedTensorVersioned *one; /* .npy: tensord_attach()'s */
	char f[4096];                  /* path, for messages */
};

static uint64_t numel(const DLTensor *t)
{
	uint64_t n = 1;

	for (int32_t d = 0; d < t->ndim; d++)
		n *= (uint64_t)t->shape[d];
	return n;
}

/* Whether t is laid out row-major compact (what a packed dtype must be). */
static bool compact(const DLTensor *t)
{
	int64_t want = 1;

	if (!t->strides)
		return true;
	for (int32_t d = t->ndim - 1; d >= 0; d--) {
		if (t->shape[d] != 1 && t->strides[d] != want)
			return false;
		want *= t->shape[d];
	}
	return true;
}

/* Checks that m can go into the file; fills its dtype name and size. */
static int check_member(struct export *x, struct member *m)
{
	const DLTensor *t = m->t;
	char q[256], dn[48], why[256];
	uint64_t bits = (uint64_t)t->dtype.bits * t->dtype.lanes;

	td_file_esc(m->full, q, sizeof(q));
	if (!tensord_device_host_accessible(t->device.device_type)) {
		char dev[32];

		return td_set_error(-ENOTSUP,
				    "%s: tensor '%s' is in %s memory; only host tensors can be "
				    "written to a file",
				    x->f, q, tensord_device_name(t->device, dev, sizeof(dev)));
	}
	tensord_dtype_name(t->dtype, dn, sizeof(dn));
	if (x->fmt == TENSORD_FILE_SAFETENSORS) {
		m->st = td_st_dtype_name(t->dtype, &m->st_lanes);
		if (!m->st)
			return td_set_error(
				-ENOTSUP, "%s: tensor '%s': dtype %s has no safetensors equivalent",
				x->f, q, dn);
	} else if (npy_descr_format(t->dtype, dn, sizeof(dn), why, sizeof(why)) < 0) {
		return td_set_error(-ENOTSUP, "%s: tensor '%s': %s; write a .safetensors", x->f, q,
				    why);
	}
	if (numel(t) * bits % 8)
		return td_set_error(-ENOTSUP,
				    "%s: tensor '%s': %" PRIu64 " values of %" PRIu64
				    " bits are not a whole number of bytes",
				    x->f, q, numel(t), bits);
	if (bits % 8 && !compact(t))
		return td_set_error(-ENOTSUP, "%s: tensor '%s': a packed dtype with strides", x->f,
				    q);
	m->nbytes = numel(t) * bits / 8;
	return 0;
}

/*
 * Maps the pages of a compact tensor in one call (MADV_POPULATE_READ, Linux
 * 5.14) rather than a fault each as write() reads them: a freshly attached
 * tensor's mapping has none yet. Only a hint: older kernels say EINVAL.
 */
static void populate(const DLTensor *t, uint64_t nbytes)
{
#ifdef MADV_POPULATE_READ
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t a = (uintptr_t)t->data + t->byte_offset, b = a + nbytes;

	if (!compact(t) || page <= 0)
		return;
	a &= ~(uintptr_t)(page - 1);
	madvise((void *)a, b - a, MADV_POPULATE_READ);
#else
	(void)t;
	(void)nbytes;
#endif
}

/* The elements of m to f, row-major. */
static int write_data(struct export *x, FILE *f, const struct member *m)
{
	const DLTensor *t = m->t;
	char why[256];

	if (m->nbytes == 0)
		return 0;
	populate(t, m->nbytes);
	if ((t->dtype.bits * t->dtype.lanes) % 8) {
		if (fwrite((const char *)t->data + t->byte_offset, 1, m->nbytes, f) != m->nbytes)
			return td_set_error(-EIO, "%s: write error: %s", x->f, strerror(errno));
		return 0;
	}
	if (npy_write_elements(f, t, why, sizeof(why)) < 0)
		return td_set_error(-EIO, "%s: %s", x->f, why);
	return 0;
}

static int write_safetensors(struct export *x, FILE *f)
{
	json_t *root = json_object(), *meta = json_object();
	uint64_t at = 0, hlen, padded;
	uint8_t le[8];
	char commit[32], *text = NULL;
	int rc = 0;

	if (!root || !meta)
		goto nomem;
	snprintf(commit, sizeof(commit), "%" PRIu64, x->commit);
	if (json_object_set_new(meta, "format", json_string("pt")) < 0 ||
	    json_object_set_new(meta, "tensord_commit", json_string(commit)) < 0 ||
	    json_object_set(root, "__metadata__", meta) < 0)
		goto nomem;
	for (size_t i = 0; i < x->n; i++) {
		const struct member *m = &x->m[i];
		json_t *e = json_object(), *shape = json_array(), *off = json_array();

		if (!e || !shape || !off || json_object_set_new(root, m->name, e) < 0) {
			json_decref(shape);
			json_decref(off);
			goto nomem;
		}
		for (int32_t d = 0; d < m->t->ndim; d++) {
			int64_t ext = m->t->shape[d];

			/* torch's float4_e2m1fn_x2: the file counts each of the two values. */
			if (d == m->t->ndim - 1)
				ext *= m->st_lanes;
			json_array_append_new(shape, json_integer(ext));
		}
		json_array_append_new(off, json_integer((json_int_t)at));
		json_array_append_new(off, json_integer((json_int_t)(at + m->nbytes)));
		if (json_object_set_new(e, "dtype", json_string(m->st)) < 0 ||
		    json_object_set_new(e, "shape", shape) < 0 ||
		    json_object_set_new(e, "data_offsets", off) < 0) {
			json_decref(off);
			goto nomem;
		}
		at += m->nbytes;
	}
	text = json_dumps(root, JSON_COMPACT);
	if (!text)
		goto nomem;
	hlen = strlen(text);
	/* Padded with spaces to 8 bytes, as the crate pads it: the data starts aligned. */
	padded = (hlen + 7) / 8 * 8;
	for (int i = 0; i < 8; i++)
		le[i] = (uint8_t)(padded >> (8 * i));
	if (fwrite(le, 1, 8, f) != 8 || fwrite(text, 1, hlen, f) != hlen ||
	    fwrite("        ", 1, padded - hlen, f) != padded - hlen) {
		rc = td_set_error(-EIO, "%s: write error: %s", x->f, strerror(errno));
		goto out;
	}
	for (size_t i = 0; i < x->n && rc == 0; i++)
		rc = write_data(x, f, &x->m[i]);
	goto out;
nomem:
	rc = td_set_error(-ENOMEM, "%s: out of memory for the header", x->f);
out:
	free(text);
	json_decref(meta);
	json_decref(root);
	return rc;
}

static int write_npy(struct export *x, FILE *f)
{
	char why[256];
	int rc = npy_write(f, x->m[0].t, why, sizeof(why));

	return rc < 0 ? td_set_error(rc, "%s: %s", x->f, why) : 0;
}

/*
 * .npz through libzip, straight to path (libzip writes beside it and
 * renames at zip_close()). Each member is its .npy header and the tensor's
 * bytes, two fragments of one source; a strided tensor is gathered first.
 */
static int write_npz(struct export *x, const char *path, uint32_t mode)
{
	char **bufs = calloc(2 * x->n + 1, sizeof(char *)), why[256], member[TENSORD_NAME_MAX + 8];
	zip_error_t ze;
	int zerr, rc = 0;
	zip_t *z;

	if (!bufs)
		return td_set_error(-ENOMEM, "%s: out of memory", x->f);
	z = zip_open(path, ZIP_CREATE | ZIP_TRUNCATE, &zerr);
	if (!z) {
		zip_error_init_with_code(&ze, zerr);
		rc = td_set_error(-EIO, "%s: %s", x->f, zip_error_strerror(&ze));
		zip_error_fini(&ze);
		free(bufs);
		return rc;
	}
	for (size_t i = 0; i < x->n && rc == 0; i++) {
		const struct member *m = &x->m[i];
		const DLTensor *t = m->t;
		zip_buffer_fragment_t frag[2];
		zip_source_t *src;
		zip_int64_t idx;
		char *hdr = malloc(4096);
		int hn;

		bufs[2 * i] = hdr;
		hn = hdr ? npy_format_header(t->dtype, t->ndim, t->shape, false, hdr, 4096, why,
					     sizeof(why))
			 : -ENOMEM;
		if (hn < 0) {
			rc = td_set_error(hn, "%s: %s", x->f, hdr ? why : "out of memory");
			break;
		}
		frag[0] = (zip_buffer_fragment_t){ (zip_uint8_t *)hdr, (zip_uint64_t)hn };
		frag[1] = (zip_buffer_fragment_t){ (zip_uint8_t *)t->data + t->byte_offset,
						   m->nbytes };
		if (m->nbytes && !compact(t)) {
			size_t size = 0;
			FILE *mf = open_memstream(&bufs[2 * i + 1], &size);

			if (!mf || npy_write_elements(mf, t, why, sizeof(why)) < 0) {
				if (mf)
					fclose(mf);
				rc = td_set_error(-ENOMEM, "%s: out of memory", x->f);
				break;
			}
			fclose(mf);
			frag[1].data = (zip_uint8_t *)bufs[2 * i + 1];
		}
		src = zip_source_buffer_fragment_create(frag, m->nbytes ? 2 : 1, 0, &ze);
		snprintf(member, sizeof(member), "%s.npy", m->name);
		idx = src ? zip_file_add(z, member, src, ZIP_FL_ENC_UTF_8) : -1;
		if (idx < 0) {
			if (src)
				zip_source_free(src);
			rc = td_set_error(-EIO, "%s: %s", x->f, zip_strerror(z));
			break;
		}
		zip_set_file_compression(z, (zip_uint64_t)idx, ZIP_CM_STORE, 0);
	}
	if (rc == 0 && zip_close(z) < 0)
		rc = td_set_error(-EIO, "%s: %s", x->f, zip_strerror(z));
	if (rc < 0)
		zip_discard(z);
	else if (mode)
		chmod(path, mode);
	for (size_t i = 0; i < 2 * x->n; i++)
		free(bufs[i]);
	free(bufs);
	return rc;
}

/* Leases what names / prefix say into x->m. */
static int gather(tensord_client *c, struct export *x, const char *const *names, size_t n_names,
		  const char *prefix)
{
	size_t plen = names ? 0 : strlen(prefix);
	int rc;

	if (x->fmt == TENSORD_FILE_NPY) {
		/* One tensor: its name (or the prefix, as tensord_put_file() takes it). */
		const char *name = names ? names[0] : prefix;

		if (names && n_names != 1)
			return td_set_error(-EINVAL, "%s: a .npy holds one tensor, not %zu", x->f,
					    n_names);
		rc = tensord_attach(c, name, 0, &x->one);
		if (rc < 0)
			return rc;
		x->m = calloc(1, sizeof(*x->m));
		if (!x->m)
			return td_set_error(-ENOMEM, "out of memory");
		x->n = 1;
		x->m[0] = (struct member){ .name = name, .full = name, .t = &x->one->dl_tensor };
		tensord_info info;
		if (tensord_tensor_info(x->one, &info) == 0)
			x->commit = info.commit;
		return check_member(x, &x->m[0]);
	}
	if (!names && (rc = td_prefix_check(prefix, x->path, true)) < 0)
		return rc;
	rc = tensord_attach_many(c, names, names ? n_names : 0, names ? NULL : prefix, 0, 0,
				 &x->set);
	if (rc < 0)
		return rc;
	if (x->set->n == 0) {
		char q[256];

		return td_set_error(-ENOENT, "%s: no tensors under '%s'", x->f,
				    td_file_esc(prefix ? prefix : "", q, sizeof(q)));
	}
	x->commit = x->set->commit;
	x->m = calloc(x->set->n, sizeof(*x->m));
	if (!x->m)
		return td_set_error(-ENOMEM, "out of memory");
	x->n = x->set->n;
	for (size_t i = 0; i < x->n; i++) {
		struct member *m = &x->m[i];

		m->full = x->set->names[i];
		m->name = m->full + plen;
		m->t = &x->set->tensors[i]->dl_tensor;
		if (!*m->name)
			return td_set_error(-EINVAL, "%s: tensor '%s' is the prefix itself", x->f,
					    m->full);
		if ((rc = check_member(x, m)) < 0)
			return rc;
	}
	return 0;
}

static int setup(struct export *x, const char *const *names, size_t n_names, const char *prefix,
		 const char *path, const tensord_file_options *opts)
{
	td_clear_error();
	x->path = path;
	snprintf(x->f, sizeof(x->f), "%s", path);
	x->fmt = opts && opts->format ? opts->format : td_file_format(path);
	if (x->fmt < TENSORD_FILE_NPY || x->fmt > TENSORD_FILE_SAFETENSORS)
		return td_set_error(-EINVAL,
				    "%s: the suffix says no format tensord writes (.safetensors, "
				    ".npz, .npy)",
				    x->f);
	if (names ? n_names == 0 : !prefix)
		return td_set_error(-EINVAL, "%s: no names and no prefix", x->f);
	return 0;
}

static void done(struct export *x, int rc, uint64_t *ret_commit, size_t *ret_n)
{
	if (rc == 0 && ret_commit)
		*ret_commit = x->commit;
	if (rc == 0 && ret_n)
		*ret_n = x->n;
	free(x->m);
	tensord_set_free(x->set);
	if (x->one)
		x->one->deleter(x->one);
}

int tensord_get_file(tensord_client *client, const char *const *names, size_t n_names,
		     const char *prefix, const char *path, const tensord_file_options *opts,
		     uint64_t *ret_commit, size_t *ret_n)
{
	struct export x = { 0 };
	char tmp[4096];
	mode_t mask;
	FILE *f = NULL;
	int fd = -1, rc;

	if (!client || !path)
		return td_set_error(-EINVAL, "get_file: client and path are required");
	rc = setup(&x, names, n_names, prefix, path, opts);
	if (rc == 0)
		rc = gather(client, &x, names, n_names, prefix);
	if (rc == 0 && x.fmt == TENSORD_FILE_NPZ) {
		mask = umask(0);
		umask(mask);
		rc = write_npz(&x, path, opts && opts->mode ? opts->mode : 0);
		goto out;
	}
	if (rc == 0 && snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", path) >= (int)sizeof(tmp))
		rc = td_set_error(-ENAMETOOLONG, "%s: path too long", x.f);
	if (rc == 0 && ((fd = mkostemp(tmp, O_CLOEXEC)) < 0 || !(f = fdopen(fd, "wb")))) {
		rc = td_set_error(-errno, "%s: %s", x.f, strerror(errno));
		if (fd >= 0) {
			close(fd);
			unlink(tmp);
		}
		goto out;
	}
	if (rc < 0)
		goto out;
	/* mkstemp makes 0600; give the file the mode open() would, or the caller's. */
	mask = umask(0);
	umask(mask);
	fchmod(fd, opts && opts->mode ? opts->mode : 0666 & ~mask);
	rc = x.fmt == TENSORD_FILE_NPY ? write_npy(&x, f) : write_safetensors(&x, f);
	if (fclose(f) != 0 && rc == 0)
		rc = td_set_error(-errno, "%s: write error: %s", x.f, strerror(errno));
	if (rc == 0 && rename(tmp, path) < 0)
		rc = td_set_error(-errno, "%s: %s", x.f, strerror(errno));
	if (rc < 0)
		unlink(tmp);
out:
	done(&x, rc, ret_commit, ret_n);
	return rc;
}

int tensord_get_file_fd(tensord_client *client, const char *const *names, size_t n_names,
			const char *prefix, int fd, const tensord_file_options *opts,
			uint64_t *ret_commit, size_t *ret_n)
{
	struct export x = { 0 };
	FILE *f = NULL;
	int dfd, rc;

	if (!client || fd < 0)
		return td_set_error(-EINVAL, "get_file_fd: client and fd are required");
	if (!opts || (opts->format != TENSORD_FILE_NPY && opts->format != TENSORD_FILE_SAFETENSORS))
		return td_set_error(-EINVAL, "get_file_fd: the format must be "
					     "TENSORD_FILE_NPY or TENSORD_FILE_SAFETENSORS");
	rc = setup(&x, names, n_names, prefix, "(stream)", opts);
	if (rc == 0)
		rc = gather(client, &x, names, n_names, prefix);
	if (rc == 0 && ((dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0 || !(f = fdopen(dfd, "wb")))) {
		rc = td_set_error(-errno, "%s: %s", x.f, strerror(errno));
		if (dfd >= 0)
			close(dfd);
	}
	if (rc == 0) {
		rc = x.fmt == TENSORD_FILE_NPY ? write_npy(&x, f) : write_safetensors(&x, f);
		if (fclose(f) != 0 && rc == 0)
			rc = td_set_error(-errno, "%s: write error: %s", x.f, strerror(errno));
	}
	done(&x, rc, ret_commit, ret_n);
	return rc;
}
