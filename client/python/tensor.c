/*
 * The Tensor type: one lease on a daemon tensor, exported through DLPack
 * (__dlpack__, __dlpack_device__); exchange.c publishes the same tensors
 * through the DLPack C exchange table.
 *
 * Ownership: the Tensor holds one DLManagedTensorVersioned; every capsule,
 * and every consumer of the exchange table, gets a share of it
 * (td_tensor_share), so arrays made from a Tensor outlive release() and the
 * Tensor itself. The daemon's lease ends when the last deleter has run.
 */
#include "tdpy.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

static const char CAPSULE_VERSIONED[] = "dltensor_versioned";
static const char CAPSULE_LEGACY[] = "dltensor";

/* Fills info from a tensor libtensord does not know (exchange-table input). */
static int info_from_dl(tensord_info *info, const DLTensor *dl)
{
	uint64_t count = 1;
	int64_t step = 1;

	if (dl->ndim < 0 || dl->ndim > TENSORD_NDIM_MAX)
		return -1;
	memset(info, 0, sizeof(*info));
	info->dtype = dl->dtype;
	info->ndim = dl->ndim;
	info->device = dl->device;
	for (int i = dl->ndim - 1; i >= 0; i--) {
		info->shape[i] = dl->shape[i];
		info->strides[i] = dl->strides ? dl->strides[i] : step;
		step *= dl->shape[i] > 1 ? dl->shape[i] : 1;
		count *= (uint64_t)(dl->shape[i] > 0 ? dl->shape[i] : 0);
	}
	info->nbytes = count * td_itemsize(dl->dtype);
	return 0;
}

PyObject *td_tensor_new(DLManagedTensorVersioned *mt, ClientObject *client)
{
	TensorObject *t = (TensorObject *)td_TensorType.tp_alloc(&td_TensorType, 0);

	if (!t) {
		mt->deleter(mt);
		return NULL;
	}
	t->mt = mt;
	t->named = tensord_tensor_info(mt, &t->info) == 0;
	if (!t->named && info_from_dl(&t->info, &mt->dl_tensor) < 0) {
		Py_DECREF(t);
		return PyErr_Format(PyExc_BufferError, "tensor has %d dimensions; at most %d fit",
				    mt->dl_tensor.ndim, TENSORD_NDIM_MAX);
	}
	t->readonly = mt->flags & DLPACK_FLAG_BITMASK_READ_ONLY;
	t->client = client ? (ClientObject *)Py_NewRef(client) : NULL;
	return (PyObject *)t;
}

static void Tensor_dealloc(TensorObject *self)
{
	if (self->weakreflist)
		PyObject_ClearWeakRefs((PyObject *)self);
	if (self->mt)
		self->mt->deleter(self->mt);
	Py_XDECREF(self->client);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

const char *td_tensor_label(TensorObject *self)
{
	return self->named ? self->info.name : "(unnamed)";
}

int td_tensor_share(TensorObject *self, DLManagedTensorVersioned **ret)
{
	int rc;

	if (!self->mt) {
		PyErr_Format(PyExc_BufferError, "tensor '%s' was released", td_tensor_label(self));
		return -1;
	}
	rc = td_share(self->mt, ret);
	if (rc < 0) {
		td_raise(rc);
		return -1;
	}
	if (self->readonly)
		(*ret)->flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
	return 0;
}

/* --- __dlpack__ --------------------------------------------------------------- */

/*
 * Capsule destructors. They only act while the capsule still has its unused
 * name: a consumer that took the tensor renamed it (or cleared the
 * destructor) and calls the deleter itself. An exception in flight is kept.
 */
static void capsule_dtor_versioned(PyObject *cap)
{
	if (PyCapsule_IsValid(cap, CAPSULE_VERSIONED)) {
		td_exc_state saved = td_exc_save();
		DLManagedTensorVersioned *mt = PyCapsule_GetPointer(cap, CAPSULE_VERSIONED);

		if (mt && mt->deleter)
			mt->deleter(mt);
		td_exc_restore(saved);
	}
}

static void capsule_dtor_legacy(PyObject *cap)
{
	if (PyCapsule_IsValid(cap, CAPSULE_LEGACY)) {
		td_exc_state saved = td_exc_save();
		DLManagedTensor *mt = PyCapsule_GetPointer(cap, CAPSULE_LEGACY);

		if (mt && mt->deleter)
			mt->deleter(mt);
		td_exc_restore(saved);
	}
}

/*
 * The stream rules of the array API standard. Host memory takes only None
 * (or -1, "do not synchronise"). For GPU tensors nothing needs ordering:
 * the creator's writes were complete when it published, so any legal value
 * is accepted and none is waited on. The legal values differ between GPU
 * vendors (CUDA's 0 is ambiguous, ROCm's 1 and 2 are not streams), so the
 * library's vendor table decides: tensord_stream_valid().
 */
static int check_stream(PyObject *stream, DLDevice dev)
{
	long s;

	if (stream == Py_None)
		return 0;
	if (!PyLong_Check(stream)) {
		PyErr_Format(PyExc_TypeError, "stream must be None or an int, not %.100s",
			     Py_TYPE(stream)->tp_name);
		return -1;
	}
	s = PyLong_AsLong(stream);
	if (s == -1 && PyErr_Occurred()) {
		/* Too big for a long: a stream handle. */
		PyErr_Clear();
		s = LONG_MAX;
	}
	if (tensord_stream_valid(dev.device_type, s))
		return 0;
	PyErr_Format(PyExc_ValueError, "stream %R is not valid for a tensor on device type %d",
		     stream, (int)dev.device_type);
	return -1;
}

/*
 * Parses and checks __dlpack__'s keywords against self: *versioned for a
 * max_version of 1.0 or later, *copy for copy=True. 0, or -1 with the
 * exception set.
 */
static int parse_export(TensorObject *self, PyObject *args, PyObject *kwds, bool *versioned,
			int *copy)
{
	static char *kwlist[] = { "stream", "max_version", "dl_device", "copy", NULL };
	PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy_o = Py_None;
	DLDevice own = self->info.device;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$OOOO:__dlpack__", kwlist, &stream,
					 &max_version, &dl_device, &copy_o))
		return -1;
	*versioned = false;
	if (max_version != Py_None) {
		long major;

		if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) != 2) {
			PyErr_Format(PyExc_TypeError,
				     "max_version must be None or a (major, minor) tuple, not %R",
				     max_version);
			return -1;
		}
		major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0));
		if (major == -1 && PyErr_Occurred())
			return -1;
		*versioned = major >= 1;
	}
	*copy = 0;
	if (copy_o != Py_None && (*copy = PyObject_IsTrue(copy_o)) < 0)
		return -1;
	if (dl_device != Py_None) {
		DLDevice want;

		if (td_parse_device_pair(dl_device, "dl_device", &want) < 0)
			return -1;
		if (want.device_type != own.device_type || want.device_id != own.device_id) {
			PyErr_Format(PyExc_BufferError,
				     "tensor '%s' lives on device (%d, %d) and cannot be "
				     "exported to %R",
				     td_tensor_label(self), (int)own.device_type, own.device_id,
				     dl_device);
			return -1;
		}
	}
	return check_stream(stream, own);
}

/*
 * Takes ownership of *mt, a share of self, and replaces it with a private
 * host copy flagged IS_COPIED; on failure *mt has been ended. 0, or -1 with
 * the exception set.
 */
static int export_copy(TensorObject *self, DLManagedTensorVersioned **mt)
{
	DLManagedTensorVersioned *src = *mt;
	int rc;

	if (!tensord_device_host_accessible(self->info.device.device_type)) {
		src->deleter(src);
		PyErr_Format(PyExc_BufferError,
			     "copy=True is only supported for tensors in host memory; "
			     "tensor '%s' is not in host memory",
			     td_tensor_label(self));
		return -1;
	}
	/* Copy from a share with the GIL released: release() in another thread cannot unmap it. */
	Py_BEGIN_ALLOW_THREADS rc =
		td_host_tensor(&src->dl_tensor, true, DLPACK_FLAG_BITMASK_IS_COPIED, mt);
	src->deleter(src);
	Py_END_ALLOW_THREADS if (rc == -ENOMEM)
	{
		PyErr_NoMemory();
		return -1;
	}
	if (rc < 0) {
		PyErr_Format(PyExc_BufferError, "tensor '%s' cannot be copied",
			     td_tensor_label(self));
		return -1;
	}
	return 0;
}

/* Takes ownership of mt. Returns a new reference to a capsule holding it, or NULL. */
static PyObject *export_capsule(DLManagedTensorVersioned *mt, bool versioned)
{
	DLManagedTensor *lt;
	PyObject *cap;

	if (versioned) {
		cap = PyCapsule_New(mt, CAPSULE_VERSIONED, capsule_dtor_versioned);
		if (!cap)
			mt->deleter(mt);
		return cap;
	}
	/*
	 * Legacy capsules cannot say "read-only". JAX asks only for these, so
	 * read-only tensors are exported anyway; writes through them cannot
	 * reach other processes, because immutable tensors are mapped
	 * copy-on-write.
	 */
	if (!(lt = td_legacy_wrap(mt)))
		return PyErr_NoMemory();
	cap = PyCapsule_New(lt, CAPSULE_LEGACY, capsule_dtor_legacy);
	if (!cap)
		lt->deleter(lt);
	return cap;
}

static PyObject *Tensor_dlpack(TensorObject *self, PyObject *args, PyObject *kwds)
{
	DLManagedTensorVersioned *mt;
	bool versioned;
	int copy;

	if (parse_export(self, args, kwds, &versioned, &copy) < 0 || td_tensor_share(self, &mt) < 0)
		return NULL;
	if (copy && export_copy(self, &mt) < 0)
		return NULL;
	return export_capsule(mt, versioned);
}

/* --- the rest of the Tensor type ------------------------------------------------ */

static PyObject *Tensor_dlpack_device(TensorObject *self, PyObject *unused)
{
	return Py_BuildValue("(ii)", (int)self->info.device.device_type,
			     self->info.device.device_id);
}

static PyObject *Tensor_release(TensorObject *self, PyObject *unused)
{
	DLManagedTensorVersioned *mt = self->mt;

	self->mt = NULL;
	if (mt) {
		Py_BEGIN_ALLOW_THREADS mt->deleter(mt);
		Py_END_ALLOW_THREADS
	}
	Py_RETURN_NONE;
}

static PyObject *Tensor_publish(TensorObject *self, PyObject *unused)
{
	tensord_version v;
	tensord_client *c;
	int rc;

	if (!self->client || !self->named)
		return PyErr_Format(PyExc_ValueError,
				    "only tensors from Client.create() can be published");
	if (!(c = td_client_enter(self->client)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = tensord_publish_version(c, self->info.name, &v);
	Py_END_ALLOW_THREADS if (td_client_leave(self->client, rc) < 0) return NULL;
	self->info.state = TENSORD_STATE_PUBLISHED;
	self->info.generation = v.generation;
	self->info.commit = v.commit;
	if (!(self->info.flags & TENSORD_MUTABLE))
		self->readonly = true;
	return PyLong_FromUnsignedLongLong(v.generation);
}

static PyObject *Tensor_get_generation(TensorObject *self, void *unused)
{
	return PyLong_FromUnsignedLongLong(self->info.generation);
}

static PyObject *Tensor_get_commit(TensorObject *self, void *unused)
{
	return PyLong_FromUnsignedLongLong(self->info.commit);
}

static PyObject *Tensor_enter(TensorObject *self, PyObject *unused)
{
	return Py_NewRef(self);
}

static PyObject *Tensor_exit(TensorObject *self, PyObject *args)
{
	return Tensor_release(self, NULL);
}

static PyObject *Tensor_repr(TensorObject *self)
{
	char dtype[64], device[32];
	PyObject *shape = td_dims_tuple(self->info.shape, self->info.ndim), *r;

	if (!shape)
		return NULL;
	r = PyUnicode_FromFormat("<tensord.Tensor %s%s%s %s %R %s%s%s>", self->named ? "'" : "",
				 td_tensor_label(self), self->named ? "'" : "",
				 tensord_dtype_name(self->info.dtype, dtype, sizeof(dtype)), shape,
				 tensord_device_name(self->info.device, device, sizeof(device)),
				 self->readonly ? " readonly" : "", self->mt ? "" : " released");
	Py_DECREF(shape);
	return r;
}

static PyObject *Tensor_get_name(TensorObject *self, void *unused)
{
	if (!self->named)
		Py_RETURN_NONE;
	return PyUnicode_FromString(self->info.name);
}

static PyObject *Tensor_get_shape(TensorObject *self, void *unused)
{
	return td_dims_tuple(self->info.shape, self->info.ndim);
}

static PyObject *Tensor_get_strides(TensorObject *self, void *unused)
{
	return td_dims_tuple(self->info.strides, self->info.ndim);
}

static PyObject *Tensor_get_dtype(TensorObject *self, void *unused)
{
	char buf[64];

	return PyUnicode_FromString(tensord_dtype_name(self->info.dtype, buf, sizeof(buf)));
}

static PyObject *Tensor_get_device(TensorObject *self, void *unused)
{
	char buf[32];

	return PyUnicode_FromString(tensord_device_name(self->info.device, buf, sizeof(buf)));
}

static PyObject *Tensor_get_nbytes(TensorObject *self, void *unused)
{
	return PyLong_FromUnsignedLongLong(self->info.nbytes);
}

static PyObject *Tensor_get_readonly(TensorObject *self, void *unused)
{
	return PyBool_FromLong(self->readonly);
}

/* libtensord's answer; False for a released tensor and one it did not make. */
static PyObject *Tensor_get_read_only_enforced(TensorObject *self, void *unused)
{
	return PyBool_FromLong(self->mt && self->named &&
			       tensord_tensor_read_only_enforced(self->mt) == 1);
}

static PyObject *Tensor_get_mutable(TensorObject *self, void *unused)
{
	return PyBool_FromLong(self->info.flags & TENSORD_MUTABLE);
}

static PyObject *Tensor_get_released(TensorObject *self, void *unused)
{
	return PyBool_FromLong(self->mt == NULL);
}

static PyMethodDef Tensor_methods[] = {
	{ "__dlpack__", (PyCFunction)(void (*)(void))Tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
	  "__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, copy=None)\n"
	  "--\n\n"
	  "Returns a PyCapsule: exports the tensor as the Python array API standard says: a "
	  "'dltensor_versioned'\n"
	  "capsule when max_version >= (1, 0), else a legacy 'dltensor' one. Zero copy unless\n"
	  "copy=True (a private copy flagged IS_COPIED). Read-only tensors carry the READ_ONLY\n"
	  "flag. Raises BufferError for what cannot be exported (another dl_device, a released\n"
	  "tensor) and TypeError only for bad or unknown keywords." },
	{ "__dlpack_device__", (PyCFunction)Tensor_dlpack_device, METH_NOARGS,
	  "__dlpack_device__($self, /)\n--\n\n"
	  "(device type, device id) as DLPack numbers them: (1, 0) for cpu, (2, n) for cuda:n." },
	{ "publish", (PyCFunction)Tensor_publish, METH_NOARGS,
	  "publish($self, /)\n--\n\n"
	  "Makes a tensor from Client.create() visible to every attach. Unless it was created\n"
	  "mutable it becomes immutable: later exports are read-only, and writes through arrays\n"
	  "made before land in a private copy that nobody else sees. Returns the name's new\n"
	  "generation." },
	{ "release", (PyCFunction)Tensor_release, METH_NOARGS,
	  "release($self, /)\n--\n\n"
	  "Ends this object's lease. Arrays made from it keep their own and stay valid until\n"
	  "they die. Idempotent; also done at the end of a with block and by the garbage\n"
	  "collector." },
	{ "__array__", (PyCFunction)(void (*)(void))td_tensor_array, METH_VARARGS | METH_KEYWORDS,
	  "__array__($self, /, dtype=None, copy=None)\n--\n\n"
	  "Returns numpy.from_dlpack(self): a zero-copy view unless dtype or copy=True ask for a "
	  "copy." },
	{ "__enter__", (PyCFunction)Tensor_enter, METH_NOARGS,
	  "__enter__($self, /)\n--\n\nReturns self." },
	{ "__exit__", (PyCFunction)Tensor_exit, METH_VARARGS,
	  "__exit__($self, /, *exc_info)\n--\n\nCalls release()." },
	{ NULL },
};

static PyGetSetDef Tensor_getset[] = {
	{ "name", (getter)Tensor_get_name, NULL,
	  "The daemon's name for the tensor (None for tensors made by the exchange table).", NULL },
	{ "shape", (getter)Tensor_get_shape, NULL, "Tuple of dimensions.", NULL },
	{ "strides", (getter)Tensor_get_strides, NULL, "Tuple of strides in elements, as DLPack.",
	  NULL },
	{ "dtype", (getter)Tensor_get_dtype, NULL, "Element type name, e.g. 'float32'.", NULL },
	{ "device", (getter)Tensor_get_device, NULL, "'cpu', 'cuda:0', ...", NULL },
	{ "nbytes", (getter)Tensor_get_nbytes, NULL, "Bytes of the allocation.", NULL },
	{ "readonly", (getter)Tensor_get_readonly, NULL,
	  "True when exports are read-only (attached immutable tensors, or after publish).", NULL },
	{ "read_only_enforced", (getter)Tensor_get_read_only_enforced, NULL,
	  "True when a write through this tensor's memory is refused by the driver here\n"
	  "(an immutable CUDA tensor mapped read-only over CUDA VMM). False for mutable\n"
	  "tensors, legacy CUDA IPC and HIP, drivers that refused a read-only mapping, and\n"
	  "host tensors (an immutable host tensor's stray write lands in a private copy).",
	  NULL },
	{ "mutable", (getter)Tensor_get_mutable, NULL, "Created with mutable=True.", NULL },
	{ "released", (getter)Tensor_get_released, NULL, "True after release().", NULL },
	{ "generation", (getter)Tensor_get_generation, NULL,
	  "The generation of its name this tensor is (1, 2, ...); 0 while unpublished.", NULL },
	{ "commit", (getter)Tensor_get_commit, NULL,
	  "The daemon-wide commit that published it; 0 while unpublished.", NULL },
	{ NULL },
};

PyTypeObject td_TensorType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tensord.Tensor",
	.tp_basicsize = sizeof(TensorObject),
	.tp_dealloc = (destructor)Tensor_dealloc,
	.tp_repr = (reprfunc)Tensor_repr,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A lease on one daemon tensor, from Client.attach() or Client.create().\n\n"
		  "Hand it to any DLPack consumer (numpy.from_dlpack, torch.from_dlpack,\n"
		  "jax.dlpack.from_dlpack) for a zero-copy array. A context manager that releases\n"
		  "the lease on exit; arrays made from it stay valid until they die.",
	.tp_weaklistoffset = offsetof(TensorObject, weakreflist),
	.tp_methods = Tensor_methods,
	.tp_getset = Tensor_getset,
	.tp_as_buffer = &td_tensor_buffer,
};
