/*
 * _tdtest: a small C consumer for the Python tests, compiled by the test
 * session. It looks at capsules the way a C consumer would (flags, strides,
 * alignment), runs deleters from a thread that does not hold the GIL, and
 * drives the DLPack C exchange table through the pointer published on the
 * type, as tvm-ffi does; and hands out capsules with whatever data pointer
 * and byte_offset a test asks for, as a buggy producer might.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tensord/dlpack.h>

static PyObject *dims(const int64_t *v, int n)
{
	PyObject *t = PyTuple_New(n);

	for (int i = 0; t && i < n; i++)
		PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(v[i]));
	return t;
}

static PyObject *describe(const DLTensor *dl, int versioned, unsigned major, unsigned minor,
			  uint64_t flags)
{
	return Py_BuildValue(
		"{s:i,s:I,s:I,s:K,s:K,s:i,s:i,s:i,s:(iii),s:N,s:N,s:K}", "versioned", versioned,
		"major", major, "minor", minor, "flags", (unsigned long long)flags, "data",
		(unsigned long long)(uintptr_t)dl->data, "device_type", (int)dl->device.device_type,
		"device_id", dl->device.device_id, "ndim", dl->ndim, "dtype", dl->dtype.code,
		dl->dtype.bits, dl->dtype.lanes, "shape",
		dl->shape ? dims(dl->shape, dl->ndim) : Py_NewRef(Py_None), "strides",
		dl->strides ? dims(dl->strides, dl->ndim) : Py_NewRef(Py_None), "byte_offset",
		(unsigned long long)dl->byte_offset);
}

/* inspect(capsule) -> dict: the DLPack fields of an unused capsule. */
static PyObject *inspect(PyObject *self, PyObject *cap)
{
	if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
		DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");

		return describe(&m->dl_tensor, 1, m->version.major, m->version.minor, m->flags);
	}
	if (PyCapsule_IsValid(cap, "dltensor")) {
		DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");

		return describe(&m->dl_tensor, 0, 0, 0, 0);
	}
	PyErr_SetString(PyExc_ValueError, "not an unused DLPack capsule");
	return NULL;
}

struct job {
	int versioned;
	void *tensor;
	pthread_t ran_on;
};

static void *run_deleter(void *arg)
{
	struct job *j = arg;

	j->ran_on = pthread_self();
	if (j->versioned) {
		DLManagedTensorVersioned *m = j->tensor;

		m->deleter(m);
	} else {
		DLManagedTensor *m = j->tensor;

		m->deleter(m);
	}
	return NULL;
}

/*
 * consume_in_thread(capsule): takes the tensor as a consumer does (rename
 * to used_*), then calls its deleter on a new thread that never held the GIL.
 */
static PyObject *consume_in_thread(PyObject *self, PyObject *cap)
{
	struct job j = { 0 };
	pthread_t th;
	int rc;

	if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
		j.versioned = 1;
		j.tensor = PyCapsule_GetPointer(cap, "dltensor_versioned");
		PyCapsule_SetName(cap, "used_dltensor_versioned");
	} else if (PyCapsule_IsValid(cap, "dltensor")) {
		j.tensor = PyCapsule_GetPointer(cap, "dltensor");
		PyCapsule_SetName(cap, "used_dltensor");
	} else {
		PyErr_SetString(PyExc_ValueError, "not an unused DLPack capsule");
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS rc = pthread_create(&th, NULL, run_deleter, &j);
	if (rc == 0)
		pthread_join(th, NULL);
	Py_END_ALLOW_THREADS if (rc != 0) return PyErr_Format(PyExc_OSError, "pthread_create: %d",
							      rc);
	Py_RETURN_NONE;
}

static const DLPackExchangeAPI *get_api(PyObject *obj)
{
	PyObject *cap =
		PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__dlpack_c_exchange_api__");
	PyObject *legacy;
	const DLPackExchangeAPI *api;

	if (!cap)
		return NULL;
	api = PyCapsule_GetPointer(cap, "dlpack_exchange_api");
	Py_DECREF(cap);
	if (!api)
		return NULL;
	legacy = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__c_dlpack_exchange_api__");
	if (!legacy)
		return NULL;
	if (PyLong_AsVoidPtr(legacy) != api) {
		Py_DECREF(legacy);
		PyErr_SetString(PyExc_AssertionError,
				"__c_dlpack_exchange_api__ and __dlpack_c_exchange_api__ differ");
		return NULL;
	}
	Py_DECREF(legacy);
	if (api->header.version.major != DLPACK_MAJOR_VERSION || api->header.prev_api ||
	    !api->managed_tensor_allocator || !api->managed_tensor_from_py_object_no_sync ||
	    !api->managed_tensor_to_py_object_no_sync || !api->current_work_stream) {
		PyErr_SetString(PyExc_AssertionError, "exchange table header or slots are wrong");
		return NULL;
	}
	return api;
}

/*
 * exchange_roundtrip(tensor) -> (info, dltensor_info, stream_is_null, obj):
 * tensor -> DLManagedTensorVersioned (from_py_object) -> Python object
 * (to_py_object, which takes it over). info describes the managed tensor;
 * dltensor_info the view from dltensor_from_py_object_no_sync.
 */
static PyObject *exchange_roundtrip(PyObject *self, PyObject *obj)
{
	const DLPackExchangeAPI *api = get_api(obj);
	DLManagedTensorVersioned *mt = NULL;
	void *stream = (void *)1, *out = NULL;
	PyObject *info, *view_info = Py_None;
	DLTensor view;

	if (!api)
		return NULL;
	if (api->managed_tensor_from_py_object_no_sync(obj, &mt) != 0)
		return NULL;
	info = describe(&mt->dl_tensor, 1, mt->version.major, mt->version.minor, mt->flags);
	if (!info) {
		mt->deleter(mt);
		return NULL;
	}
	if (api->dltensor_from_py_object_no_sync) {
		if (api->dltensor_from_py_object_no_sync(obj, &view) != 0) {
			mt->deleter(mt);
			Py_DECREF(info);
			return NULL;
		}
		view_info = describe(&view, 0, 0, 0, 0);
	} else {
		Py_INCREF(view_info);
	}
	if (api->current_work_stream(kDLCPU, 0, &stream) != 0 ||
	    api->managed_tensor_to_py_object_no_sync(mt, &out) != 0) {
		Py_DECREF(info);
		Py_XDECREF(view_info);
		return NULL;
	}
	return Py_BuildValue("(NNON)", info, view_info, stream == NULL ? Py_True : Py_False,
			     (PyObject *)out);
}

/* exchange_from_py(obj): calls managed_tensor_from_py_object_no_sync, for its errors. */
static PyObject *exchange_from_py(PyObject *self, PyObject *args)
{
	PyObject *kind, *obj;
	const DLPackExchangeAPI *api;
	DLManagedTensorVersioned *mt = NULL;

	if (!PyArg_ParseTuple(args, "OO", &kind, &obj) || !(api = get_api(kind)))
		return NULL;
	if (api->managed_tensor_from_py_object_no_sync(obj, &mt) != 0)
		return NULL;
	mt->deleter(mt);
	Py_RETURN_NONE;
}

struct seterr {
	int calls;
	char kind[64];
	char message[256];
};

static void set_error(void *ctx, const char *kind, const char *message)
{
	struct seterr *e = ctx;

	e->calls++;
	snprintf(e->kind, sizeof(e->kind), "%s", kind);
	snprintf(e->message, sizeof(e->message), "%s", message);
}

/*
 * exchange_alloc(tensor, shape, device_type) -> object or (kind, message, calls):
 * a float32 tensor from managed_tensor_allocator, wrapped by to_py_object.
 */
static PyObject *exchange_alloc(PyObject *self, PyObject *args)
{
	PyObject *obj, *shape_o;
	int device_type;
	const DLPackExchangeAPI *api;
	int64_t shape[8];
	DLTensor proto = { 0 };
	DLManagedTensorVersioned *mt = NULL;
	struct seterr err = { 0 };
	void *out = NULL;
	Py_ssize_t n;

	if (!PyArg_ParseTuple(args, "OO!i", &obj, &PyTuple_Type, &shape_o, &device_type) ||
	    !(api = get_api(obj)))
		return NULL;
	n = PyTuple_GET_SIZE(shape_o);
	if (n > 8)
		return PyErr_Format(PyExc_ValueError, "at most 8 dimensions");
	for (Py_ssize_t i = 0; i < n; i++)
		shape[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape_o, i));
	proto.device = (DLDevice){ (DLDeviceType)device_type, 0 };
	proto.ndim = (int32_t)n;
	proto.dtype = (DLDataType){ kDLFloat, 32, 1 };
	proto.shape = n ? shape : NULL;
	if (api->managed_tensor_allocator(&proto, &mt, &err, set_error) != 0)
		return Py_BuildValue("(ssi)", err.kind, err.message, err.calls);
	if (err.calls)
		return PyErr_Format(PyExc_AssertionError, "SetError called on success");
	if ((uintptr_t)mt->dl_tensor.data % 64 || (n && !mt->dl_tensor.strides))
		return PyErr_Format(PyExc_AssertionError, "allocator: misaligned or no strides");
	memset(mt->dl_tensor.data, 0, 4);
	if (api->managed_tensor_to_py_object_no_sync(mt, &out) != 0)
		return NULL;
	return out;
}

/* --- hand-made producers, for put()'s checks of what a producer hands over --- */

static long raw_deleted; /* how many raw_capsule tensors were deleted */

struct raw {
	DLManagedTensorVersioned mt;
	int64_t shape[1];
};

static void raw_delete(DLManagedTensorVersioned *mt)
{
	raw_deleted++;
	free(mt);
}

static void raw_capsule_free(PyObject *cap)
{
	DLManagedTensorVersioned *mt;

	/* Deleted here only when nobody consumed it (it still has its name). */
	if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
		mt = PyCapsule_GetPointer(cap, "dltensor_versioned");
		mt->deleter(mt);
	}
}

/*
 * raw_capsule(data, nbytes, byte_offset) -> an unused "dltensor_versioned"
 * capsule of nbytes uint8 on the CPU whose data pointer is the integer
 * data (0: NULL) and whose byte_offset is as given, checked by nothing:
 * what a buggy producer could hand over.
 */
static PyObject *raw_capsule(PyObject *self, PyObject *args)
{
	unsigned long long data, nbytes, byte_offset;
	struct raw *r;
	PyObject *cap;

	if (!PyArg_ParseTuple(args, "KKK", &data, &nbytes, &byte_offset))
		return NULL;
	r = calloc(1, sizeof(*r));
	if (!r)
		return PyErr_NoMemory();
	r->shape[0] = (int64_t)nbytes;
	r->mt.version.major = DLPACK_MAJOR_VERSION;
	r->mt.version.minor = DLPACK_MINOR_VERSION;
	r->mt.deleter = raw_delete;
	r->mt.dl_tensor.data = (void *)(uintptr_t)data;
	r->mt.dl_tensor.device = (DLDevice){ kDLCPU, 0 };
	r->mt.dl_tensor.ndim = 1;
	r->mt.dl_tensor.dtype = (DLDataType){ kDLUInt, 8, 1 };
	r->mt.dl_tensor.shape = r->shape;
	r->mt.dl_tensor.byte_offset = byte_offset;
	cap = PyCapsule_New(&r->mt, "dltensor_versioned", raw_capsule_free);
	if (!cap)
		free(r);
	return cap;
}

static PyObject *raw_deleted_count(PyObject *self, PyObject *unused)
{
	return PyLong_FromLong(raw_deleted);
}

static PyMethodDef methods[] = {
	{ "inspect", inspect, METH_O, NULL },
	{ "consume_in_thread", consume_in_thread, METH_O, NULL },
	{ "exchange_roundtrip", exchange_roundtrip, METH_O, NULL },
	{ "exchange_from_py", exchange_from_py, METH_VARARGS, NULL },
	{ "exchange_alloc", exchange_alloc, METH_VARARGS, NULL },
	{ "raw_capsule", raw_capsule, METH_VARARGS, NULL },
	{ "raw_deleted", raw_deleted_count, METH_NOARGS, NULL },
	{ NULL },
};

static struct PyModuleDef moddef = { PyModuleDef_HEAD_INIT, "_tdtest", NULL, -1, methods };

PyMODINIT_FUNC PyInit__tdtest(void)
{
	return PyModule_Create(&moddef);
}
