/*
 * Client.put(): one copy of a foreign array into a new daemon tensor.
 *
 * The source is read through DLPack when the object has __dlpack__ (numpy,
 * torch, jax, a tensord.Tensor) or is a raw DLPack capsule, else through
 * the buffer protocol. The copy itself (tensord_put) runs with the GIL
 * released; the source stays alive because we hold its capsule or buffer.
 */
#include "tdpy.h"

#include <errno.h>
#include <string.h>

/*
 * Ends what s holds: the consumed tensor and the buffer view. Called with
 * the GIL held: a producer's deleter may need it (numpy's does). An
 * exception already set is kept.
 */
void td_source_release(struct td_source *s)
{
	td_exc_state saved = td_exc_save();

	if (s->versioned && s->versioned->deleter)
		s->versioned->deleter(s->versioned);
	if (s->legacy && s->legacy->deleter)
		s->legacy->deleter(s->legacy);
	if (s->have_view)
		PyBuffer_Release(&s->view);
	td_exc_restore(saved);
}

/*
 * Checks dl and points s->dl at its memory with strides filled. Borrowed:
 * dl, only for the call; the memory stays alive through what s holds.
 */
static int source_set(struct td_source *s, const DLTensor *dl)
{
	bool on_gpu = tensord_device_is_gpu(dl->device.device_type);
	int64_t step = 1;

	if (!tensord_device_host_accessible(dl->device.device_type) && !on_gpu) {
		PyErr_Format(
			PyExc_BufferError,
			"put() copies host or GPU memory, and this array is on device type %d; "
			"use create(..., device=...) and copy into it, then publish()",
			(int)dl->device.device_type);
		return -1;
	}
	if (dl->ndim < 0 || dl->ndim > TENSORD_NDIM_MAX) {
		PyErr_Format(PyExc_BufferError, "array has %d dimensions; at most %d are allowed",
			     dl->ndim, TENSORD_NDIM_MAX);
		return -1;
	}
	if (dl->ndim && !dl->shape) {
		PyErr_Format(
			PyExc_ValueError,
			"put() argument 'obj': its DLPack tensor has %d dimensions but no shape",
			dl->ndim);
		return -1;
	}
	s->dl = *dl;
	/* GPU sources keep their device: libtensord copies device to device. */
	s->dl.device = on_gpu ? dl->device : (DLDevice){ kDLCPU, 0 };
	/* data and byte_offset stay as the producer gave them: tensord_put()
	 * checks them (a NULL pointer, an offset that wraps, unmapped memory)
	 * before it reads a byte, so no pointer is computed from them here. */
	for (int i = dl->ndim - 1; i >= 0; i--) {
		s->strides[i] = dl->strides ? dl->strides[i] : step;
		step *= dl->shape[i] > 1 ? dl->shape[i] : 1;
	}
	s->dl.strides = dl->ndim ? s->strides : NULL;
	return 0;
}

/*
 * Takes the tensor out of a DLPack capsule: renames it, so it is ours to
 * delete. Once renamed, s owns the tensor even if a later check fails;
 * source_release() ends it.
 */
static int source_from_capsule(struct td_source *s, PyObject *cap)
{
	if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
		s->versioned = PyCapsule_GetPointer(cap, "dltensor_versioned");
		if (PyCapsule_SetName(cap, "used_dltensor_versioned") < 0) {
			s->versioned = NULL;
			return -1;
		}
		if (s->versioned->version.major != DLPACK_MAJOR_VERSION) {
			PyErr_Format(PyExc_BufferError, "DLPack major version %u is not supported",
				     s->versioned->version.major);
			return -1;
		}
		return source_set(s, &s->versioned->dl_tensor);
	}
	if (PyCapsule_IsValid(cap, "dltensor")) {
		s->legacy = PyCapsule_GetPointer(cap, "dltensor");
		if (PyCapsule_SetName(cap, "used_dltensor") < 0) {
			s->legacy = NULL;
			return -1;
		}
		return source_set(s, &s->legacy->dl_tensor);
	}
	PyErr_Format(PyExc_BufferError, "expected an unused DLPack capsule, got %R", cap);
	return -1;
}

/*
 * The keywords put() passes to obj.__dlpack__: max_version (unless
 * without_version: a producer that does not know it), and for a GPU
 * source the stream the copy will run on (tensord_put_stream()), so that
 * the producer orders its queued writes before that stream as DLPack asks
 * of it. Host sources get no stream (DLPack: None for kDLCPU). A new
 * reference, or NULL with an exception set.
 */
static PyObject *dlpack_kwargs(long device_type, bool without_version)
{
	long stream = tensord_put_stream(device_type);
	PyObject *kw = PyDict_New(), *v;

	if (!kw)
		return NULL;
	if (!without_version) {
		v = Py_BuildValue("(ii)", DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION);
		if (!v || PyDict_SetItemString(kw, "max_version", v) < 0)
			goto fail;
		Py_DECREF(v);
	}
	if (stream != -1L) {
		v = PyLong_FromLong(stream);
		if (!v || PyDict_SetItemString(kw, "stream", v) < 0)
			goto fail;
		Py_DECREF(v);
	}
	return kw;
fail:
	Py_XDECREF(v);
	Py_DECREF(kw);
	return NULL;
}

/* obj's DLPack device type from __dlpack_device__, or kDLCPU when it has none; -1 on error. */
static long dlpack_device_type(PyObject *obj)
{
	PyObject *dev;
	long type = kDLCPU;

	if (!PyObject_HasAttrString(obj, "__dlpack_device__"))
		return kDLCPU;
	dev = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
	if (!dev)
		return -1;
	if (PyTuple_Check(dev) && PyTuple_GET_SIZE(dev) == 2)
		type = PyLong_AsLong(PyTuple_GET_ITEM(dev, 0));
	Py_DECREF(dev);
	return type;
}

/*
 * Asks obj for a capsule, with max_version first and, for producers that
 * do not know that keyword (TypeError is how they say so), without it; a
 * GPU source is always asked with the stream the copy runs on (see
 * dlpack_kwargs()), so that its producer's queued writes come first.
 * Devices that are neither host memory nor a GPU libtensord can copy on
 * are refused before asking, so that a producer is never asked to
 * synchronise for nothing.
 */
static int source_from_dlpack(struct td_source *s, PyObject *obj)
{
	long type = dlpack_device_type(obj);
	PyObject *meth, *cap = NULL, *kw;
	int rc;

	if (type == -1 && PyErr_Occurred())
		return -1;
	if (!tensord_device_host_accessible((DLDeviceType)type) &&
	    !tensord_device_is_gpu((DLDeviceType)type)) {
		DLTensor probe = { .device = { (DLDeviceType)type, 0 } };

		return source_set(s, &probe);
	}
	if (!(meth = PyObject_GetAttrString(obj, "__dlpack__")))
		return -1;
	for (int old = 0; old < 2 && !cap; old++) {
		if (old && !PyErr_ExceptionMatches(PyExc_TypeError))
			break;
		PyErr_Clear();
		kw = dlpack_kwargs(type, old);
		cap = kw ? PyObject_VectorcallDict(meth, NULL, 0, kw) : NULL;
		Py_XDECREF(kw);
	}
	Py_DECREF(meth);
	if (!cap)
		return -1;
	rc = source_from_capsule(s, cap);
	Py_DECREF(cap);
	return rc;
}

/* Maps a struct-module format string to a DLPack dtype. */
static int format_dtype(const char *fmt, Py_ssize_t itemsize, DLDataType *dt)
{
	const char *f = fmt ? fmt : "B";
	bool native = true;

	switch (*f) {
	case '@':
	case '=':
		f++;
		break;
	case '<':
		native = PY_LITTLE_ENDIAN;
		f++;
		break;
	case '>':
	case '!':
		native = !PY_LITTLE_ENDIAN;
		f++;
		break;
	}
	if (!native) {
		PyErr_Format(PyExc_BufferError, "buffer format '%s' is not in native byte order",
			     fmt);
		return -1;
	}
	if (f[0] == 'Z' && f[1] && strchr("efd", f[1]) && !f[2])
		dt->code = kDLComplex;
	else if (!f[0] || f[1])
		goto unsupported;
	else if (f[0] == '?')
		dt->code = kDLBool;
	else if (strchr("bhilqn", f[0]))
		dt->code = kDLInt;
	else if (strchr("BHILQNc", f[0]))
		dt->code = kDLUInt;
	else if (strchr("efd", f[0]))
		dt->code = kDLFloat;
	else
		goto unsupported;
	if (itemsize <= 0 || itemsize > 16 || (itemsize & (itemsize - 1)))
		goto unsupported;
	dt->bits = (uint8_t)(itemsize * 8);
	dt->lanes = 1;
	return 0;

unsupported:
	PyErr_Format(PyExc_BufferError, "buffer format '%s' has no tensord dtype", fmt);
	return -1;
}

/* The buffer view is held in s, even on failure, until source_release(). */
static int source_from_buffer(struct td_source *s, PyObject *obj)
{
	Py_buffer *v = &s->view;
	DLTensor dl = { 0 };
	int64_t strides[TENSORD_NDIM_MAX];

	if (PyObject_GetBuffer(obj, v, PyBUF_RECORDS_RO) < 0)
		return -1;
	s->have_view = true;
	if (format_dtype(v->format, v->itemsize, &dl.dtype) < 0)
		return -1;
	if (v->ndim > TENSORD_NDIM_MAX) {
		PyErr_Format(PyExc_BufferError, "buffer has %d dimensions; at most %d are allowed",
			     v->ndim, TENSORD_NDIM_MAX);
		return -1;
	}
	for (int i = 0; i < v->ndim; i++) {
		if (v->strides[i] % v->itemsize) {
			PyErr_SetString(PyExc_BufferError,
					"buffer strides are not a multiple of its item size");
			return -1;
		}
		s->shape[i] = v->shape[i];
		strides[i] = v->strides[i] / v->itemsize;
	}
	dl.data = v->buf;
	dl.device = (DLDevice){ kDLCPU, 0 };
	dl.ndim = v->ndim;
	dl.shape = v->ndim ? s->shape : NULL;
	dl.strides = v->ndim ? strides : NULL;
	return source_set(s, &dl);
}

/*
 * td_client_leave() for tensord_put(): -EFAULT means the source's memory
 * cannot be read (a NULL data pointer, a byte_offset that wraps or points
 * at nothing; tensord_put() says which, naming the tensor), so the
 * argument is wrong, not the daemon: ValueError.
 */
int td_put_leave(ClientObject *self, int rc)
{
	if (rc != -EFAULT)
		return td_client_leave(self, rc);
	PyErr_Format(PyExc_ValueError, "put() argument 'obj': %s", tensord_last_error());
	td_client_leave(self, 0);
	return rc;
}

PyObject *td_client_put(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "name", "obj",     "mutable", "lifetime",
				  "mode", "replace", "sealed",  NULL };
	PyObject *obj, *mutable_o = NULL, *lifetime_o = NULL, *mode_o = NULL;
	struct td_source s = { 0 };
	tensord_version v;
	tensord_client *c;
	const char *name;
	uint32_t flags, mode;
	int rc, replace = 0, sealed = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "sO|OOO$pp:put", kwlist, &name, &obj,
					 &mutable_o, &lifetime_o, &mode_o, &replace, &sealed) ||
	    td_parse_flags(mutable_o, lifetime_o, mode_o, &flags, &mode) < 0)
		return NULL;
	if (replace)
		flags |= TENSORD_REPLACE;
	if (sealed)
		flags |= TENSORD_SEALED;
	rc = td_source_from(&s, obj);
	if (rc < 0 || !(c = td_client_enter(self))) {
		td_source_release(&s);
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS rc = tensord_put_version(c, name, &s.dl, flags, mode, &v);
	Py_END_ALLOW_THREADS rc = td_put_leave(self, rc);
	td_source_release(&s);
	if (rc < 0)
		return NULL;
	return PyLong_FromUnsignedLongLong(v.generation);
}

/*
 * obj.detach() when obj is a tensor that requires grad (a torch Parameter,
 * an activation), which torch refuses to export ("Can't export tensors that
 * require gradient"): the put copies, so the autograd graph does not
 * matter. A new reference: obj itself when it needs none; NULL with an
 * exception.
 */
/*
 * Whether objects of type t may need detaching: t has requires_grad and
 * detach. Asked of the type once (a failed attribute lookup raises and
 * clears an AttributeError: 6,000 instructions on each numpy put), then
 * kept for the last few types seen, each referenced. GIL held.
 */
static bool type_may_need_grad(PyTypeObject *t)
{
	static struct {
		PyTypeObject *type;
		bool grad;
	} seen[8];
	static unsigned next;
	bool grad;

	for (size_t i = 0; i < sizeof(seen) / sizeof(seen[0]); i++)
		if (seen[i].type == t)
			return seen[i].grad;
	grad = PyObject_HasAttrString((PyObject *)t, "requires_grad") &&
	       PyObject_HasAttrString((PyObject *)t, "detach");
	next = (next + 1) % (sizeof(seen) / sizeof(seen[0]));
	Py_XDECREF(seen[next].type);
	Py_INCREF(t);
	seen[next].type = t;
	seen[next].grad = grad;
	return grad;
}

static PyObject *source_detached(PyObject *obj)
{
	PyObject *rg;
	int needs;

	if (!type_may_need_grad(Py_TYPE(obj)) || !PyObject_HasAttrString(obj, "requires_grad") ||
	    !PyObject_HasAttrString(obj, "detach"))
		return Py_NewRef(obj);
	if (!(rg = PyObject_GetAttrString(obj, "requires_grad")))
		return NULL;
	needs = PyObject_IsTrue(rg);
	Py_DECREF(rg);
	if (needs < 0)
		return NULL;
	return needs ? PyObject_CallMethod(obj, "detach", NULL) : Py_NewRef(obj);
}

/*
 * An array of a dtype whose producer's DLPack does not carry it (numpy
 * with ml_dtypes' bfloat16 and float8 types: BufferError) but that tensord
 * names as obj.dtype.name: its bytes as unsigned integers of the same size
 * (obj.view("u<size>")), with that dtype. 0 when done; -1 with an
 * exception when obj is no such array or the view cannot be read.
 */
static int source_as_bits(struct td_source *s, PyObject *obj)
{
	PyObject *dtype, *name = NULL, *size = NULL, *view = NULL;
	const char *txt;
	long itemsize;
	char fmt[8];
	DLDataType dt;
	int rc = -1;

	if (!(dtype = PyObject_GetAttrString(obj, "dtype")) ||
	    !(name = PyObject_GetAttrString(dtype, "name")) ||
	    !(size = PyObject_GetAttrString(dtype, "itemsize")) || !PyUnicode_Check(name) ||
	    !(txt = PyUnicode_AsUTF8(name)) || (itemsize = PyLong_AsLong(size)) < 0)
		goto out;
	if (tensord_dtype_parse(txt, &dt) < 0 || dt.lanes != 1 || dt.bits != itemsize * 8 ||
	    (itemsize != 1 && itemsize != 2)) {
		PyErr_Format(PyExc_BufferError, "dtype '%s' is not one tensord can take as bits",
			     txt);
		goto out;
	}
	snprintf(fmt, sizeof(fmt), "u%ld", itemsize);
	if (!(view = PyObject_CallMethod(obj, "view", "s", fmt)) || source_from_dlpack(s, view) < 0)
		goto out;
	s->dl.dtype = dt;
	rc = 0;
out:
	Py_XDECREF(view);
	Py_XDECREF(size);
	Py_XDECREF(name);
	Py_XDECREF(dtype);
	return rc;
}

int td_source_from(struct td_source *s, PyObject *obj)
{
	memset(s, 0, sizeof(*s));
	if (PyCapsule_CheckExact(obj))
		return source_from_capsule(s, obj);
	if (PyObject_HasAttrString(obj, "__dlpack__")) {
		/* The capsule keeps the detached tensor's storage alive. */
		PyObject *src = source_detached(obj);
		int rc = src ? source_from_dlpack(s, src) : -1;

		if (rc < 0 && src && PyErr_ExceptionMatches(PyExc_BufferError) && !s->versioned &&
		    !s->legacy && !s->have_view) {
			/* The producer's own error stays unless the bits path works. */
			td_exc_state saved = td_exc_save();

			rc = source_as_bits(s, src);
			if (rc < 0)
				PyErr_Clear();
			td_exc_restore(saved);
			if (rc == 0)
				PyErr_Clear();
		}
		Py_XDECREF(src);
		return rc;
	}
	if (PyObject_CheckBuffer(obj))
		return source_from_buffer(s, obj);
	PyErr_Format(PyExc_TypeError, "put() needs a DLPack producer or a buffer, not %.100s",
		     Py_TYPE(obj)->tp_name);
	return -1;
}
