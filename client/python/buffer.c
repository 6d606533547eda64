/*
 * The buffer protocol and __array__ on Tensor, so that memoryview(t),
 * bytes(t) and numpy.asarray(t) see a host tensor's bytes, zero copy,
 * without from_dlpack. Each buffer export holds its own share of the lease
 * (as a DLPack capsule does), so release() of the Tensor never pulls the
 * memory from under a memoryview; the share ends in releasebuffer.
 */
#include "tdpy.h"

#include <string.h>

/* One export: its share of the lease and the shape and strides it points to. */
struct export
{
	DLManagedTensorVersioned *mt; /* owned: ended by releasebuffer */
	Py_ssize_t shape[TENSORD_NDIM_MAX];
	Py_ssize_t strides[TENSORD_NDIM_MAX]; /* in bytes */
};

/* The struct-module format of dt, or NULL when it has none (bfloat16, lanes). */
static const char *format_of(DLDataType dt)
{
	static const struct {
		uint8_t code, bits;
		const char *fmt;
	} formats[] = {
		{ kDLBool, 8, "?" },      { kDLInt, 8, "b" },        { kDLUInt, 8, "B" },
		{ kDLInt, 16, "h" },      { kDLUInt, 16, "H" },      { kDLInt, 32, "i" },
		{ kDLUInt, 32, "I" },     { kDLInt, 64, "q" },       { kDLUInt, 64, "Q" },
		{ kDLFloat, 16, "e" },    { kDLFloat, 32, "f" },     { kDLFloat, 64, "d" },
		{ kDLComplex, 64, "Zf" }, { kDLComplex, 128, "Zd" },
	};

	if (dt.lanes != 1)
		return NULL;
	for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++)
		if (formats[i].code == dt.code && formats[i].bits == dt.bits)
			return formats[i].fmt;
	return NULL;
}

/*
 * Set by ml_dtypes_array() around one export, guarded by the GIL: a dtype
 * with no struct format is then exported as unsigned integers of its size.
 */
static bool raw_export;

/* The unsigned format of an element of size bytes, for raw_export. */
static const char *raw_format(DLDataType dt)
{
	if (dt.lanes != 1)
		return NULL;
	switch (dt.bits) {
	case 8:
		return "B";
	case 16:
		return "H";
	default:
		return NULL;
	}
}

/* Whether strides (in bytes) are row-major compact for shape. */
static bool c_contiguous(int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides,
			 Py_ssize_t itemsize)
{
	Py_ssize_t want = itemsize;

	for (int i = ndim - 1; i >= 0; i--) {
		if (shape[i] > 1 && strides[i] != want)
			return false;
		want *= shape[i];
	}
	return true;
}

static int Tensor_getbuffer(TensorObject *self, Py_buffer *view, int flags)
{
	const tensord_info *in = &self->info;
	const char *fmt = format_of(in->dtype) ?: (raw_export ? raw_format(in->dtype) : NULL);
	Py_ssize_t itemsize = (in->dtype.bits + 7) / 8, len = itemsize;
	struct export *e;
	char name[32];

	if (in->device.device_type != kDLCPU) {
		PyErr_Format(PyExc_BufferError,
			     "tensor '%s' is on %s: the buffer protocol covers "
			     "host memory; use a framework's from_dlpack",
			     td_tensor_label(self),
			     tensord_device_name(in->device, name, sizeof(name)));
		return -1;
	}
	if (!fmt) {
		PyErr_Format(PyExc_BufferError,
			     "tensor '%s': dtype %s has no buffer format; use "
			     "a framework's from_dlpack",
			     td_tensor_label(self),
			     tensord_dtype_name(in->dtype, name, sizeof(name)));
		return -1;
	}
	if ((flags & PyBUF_WRITABLE) && self->readonly) {
		PyErr_Format(PyExc_BufferError, "tensor '%s' is read-only", td_tensor_label(self));
		return -1;
	}
	if (!(e = PyMem_Calloc(1, sizeof(*e)))) {
		PyErr_NoMemory();
		return -1;
	}
	for (int i = 0; i < in->ndim; i++) {
		e->shape[i] = (Py_ssize_t)in->shape[i];
		e->strides[i] = (Py_ssize_t)in->strides[i] * itemsize;
		len *= e->shape[i];
	}
	if (!(flags & PyBUF_STRIDES) && !c_contiguous(in->ndim, e->shape, e->strides, itemsize)) {
		PyMem_Free(e);
		PyErr_Format(PyExc_BufferError, "tensor '%s' is strided; ask for a strided buffer",
			     td_tensor_label(self));
		return -1;
	}
	if (td_tensor_share(self, &e->mt) < 0) {
		PyMem_Free(e);
		return -1;
	}
	view->buf = (char *)e->mt->dl_tensor.data + e->mt->dl_tensor.byte_offset;
	view->obj = Py_NewRef((PyObject *)self);
	view->len = len;
	view->readonly = self->readonly;
	view->itemsize = itemsize;
	view->format = (flags & PyBUF_FORMAT) ? (char *)fmt : NULL;
	view->ndim = in->ndim;
	view->shape = (flags & PyBUF_ND) ? e->shape : NULL;
	view->strides = (flags & PyBUF_STRIDES) ? e->strides : NULL;
	view->suboffsets = NULL;
	view->internal = e;
	return 0;
}

static void Tensor_releasebuffer(TensorObject *self, Py_buffer *view)
{
	struct export *e = view->internal;

	if (!e)
		return;
	e->mt->deleter(e->mt);
	PyMem_Free(e);
	view->internal = NULL;
}

PyBufferProcs td_tensor_buffer = {
	.bf_getbuffer = (getbufferproc)Tensor_getbuffer,
	.bf_releasebuffer = (releasebufferproc)Tensor_releasebuffer,
};

/*
 * numpy view of a host tensor whose dtype numpy lacks but ml_dtypes names
 * (bfloat16, the float8 types): the bytes as unsigned integers, viewed as
 * ml_dtypes' type, zero copy (the memoryview under it holds a share of the
 * lease). NULL with an exception when ml_dtypes is not there or lacks it.
 */
static PyObject *ml_dtypes_array(TensorObject *self, PyObject *np)
{
	PyObject *ml, *type = NULL, *mv = NULL, *raw = NULL, *out = NULL;
	char name[32];

	if (!(ml = PyImport_ImportModule("ml_dtypes")))
		return NULL;
	tensord_dtype_name(self->info.dtype, name, sizeof(name));
	if (!raw_format(self->info.dtype) || !PyObject_HasAttrString(ml, name)) {
		PyErr_Format(PyExc_BufferError, "ml_dtypes has no dtype %s", name);
		goto out;
	}
	if (!(type = PyObject_GetAttrString(ml, name)))
		goto out;
	raw_export = true;
	mv = PyMemoryView_FromObject((PyObject *)self);
	raw_export = false;
	if (mv && (raw = PyObject_CallMethod(np, "asarray", "O", mv)))
		out = PyObject_CallMethod(raw, "view", "O", type);
out:
	Py_XDECREF(raw);
	Py_XDECREF(mv);
	Py_XDECREF(type);
	Py_DECREF(ml);
	return out;
}

PyObject *td_tensor_array(TensorObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "dtype", "copy", NULL };
	PyObject *dtype = Py_None, *copy = Py_None, *np, *a, *out;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OO:__array__", kwlist, &dtype, &copy))
		return NULL;
	if (!(np = PyImport_ImportModule("numpy")))
		return NULL;
	a = NULL;
	if (!format_of(self->info.dtype) && raw_format(self->info.dtype) &&
	    self->info.device.device_type == kDLCPU && !(a = ml_dtypes_array(self, np)))
		PyErr_Clear(); /* numpy's DLPack lacks the dtype, and ml_dtypes too */
	if (!a)
		a = PyObject_CallMethod(np, "from_dlpack", "O", (PyObject *)self);
	if (a && (dtype != Py_None || PyObject_IsTrue(copy) == 1)) {
		out = dtype != Py_None ? PyObject_CallMethod(a, "astype", "O", dtype)
				       : PyObject_CallMethod(a, "copy", NULL);
		Py_SETREF(a, out);
	}
	Py_DECREF(np);
	return a;
}
