/*
 * The DLPack C exchange table (DLPackExchangeAPI): lets a consumer written
 * in C exchange tensors with tensord.Tensor without a capsule or a Python
 * call. Published on td_TensorType under both names consumers look for.
 * Every tensor handed out is a share of the Tensor's lease (see tensor.c),
 * and every tensor taken in ends up owned by a new Tensor.
 */
#include "tdpy.h"

#include <errno.h>

/* *out: a new private host tensor owned by the caller, ended by its deleter. */
static int x_allocator(DLTensor *prototype, DLManagedTensorVersioned **out, void *error_ctx,
		       void (*SetError)(void *error_ctx, const char *kind, const char *message))
{
	int rc;

	/*
	 * Not a question of host access: the tensor made is kDLCPU, so a
	 * prototype on any other device type (pinned host memory included)
	 * would get a tensor on a device it did not ask for.
	 */
	if (prototype->device.device_type != kDLCPU) {
		SetError(error_ctx, "BufferError",
			 "tensord allocates private tensors on the cpu only");
		return -1;
	}
	rc = td_host_tensor(prototype, false, 0, out);
	if (rc == -ENOMEM) {
		SetError(error_ctx, "MemoryError", "out of memory");
		return -1;
	}
	if (rc < 0) {
		SetError(error_ctx, "ValueError", "unsupported dtype or shape");
		return -1;
	}
	return 0;
}

static TensorObject *as_tensor(void *py_object)
{
	PyObject *o = py_object;

	if (!PyObject_TypeCheck(o, &td_TensorType)) {
		PyErr_Format(PyExc_TypeError, "expected a tensord.Tensor, not %.100s",
			     Py_TYPE(o)->tp_name);
		return NULL;
	}
	return (TensorObject *)o;
}

/* *out: a new share of the Tensor's lease, owned by the caller. */
static int x_from_py(void *py_object, DLManagedTensorVersioned **out)
{
	TensorObject *t = as_tensor(py_object);

	return t ? td_tensor_share(t, out) : -1;
}

/* Takes ownership of tensor: a new Tensor holds it, or it is ended. */
static int x_to_py(DLManagedTensorVersioned *tensor, void **out_py_object)
{
	tensord_info info;
	PyObject *o;

	if (tensor->version.major != DLPACK_MAJOR_VERSION) {
		PyErr_Format(PyExc_BufferError, "DLPack major version %u is not supported",
			     tensor->version.major);
		if (tensor->deleter)
			tensor->deleter(tensor);
		return -1;
	}
	if (!td_is_foreign(tensor) && tensord_tensor_info(tensor, &info) < 0 &&
	    td_foreign_wrap(tensor, &tensor) < 0) {
		PyErr_NoMemory();
		return -1;
	}
	o = td_tensor_new(tensor, NULL);
	if (!o)
		return -1;
	*out_py_object = o;
	return 0;
}

/* Borrowed: *out points into the Tensor's lease, valid until its release(). */
static int x_dltensor(void *py_object, DLTensor *out)
{
	TensorObject *t = as_tensor(py_object);

	if (!t)
		return -1;
	if (!t->mt) {
		PyErr_Format(PyExc_BufferError, "tensor '%s' was released", td_tensor_label(t));
		return -1;
	}
	*out = t->mt->dl_tensor;
	return 0;
}

static int x_current_work_stream(DLDeviceType device_type, int32_t device_id, void **out)
{
	/* NULL is the default stream; the daemon's tensors need no other ordering. */
	*out = NULL;
	return 0;
}

static const DLPackExchangeAPI td_exchange_api = {
	.header = { .version = { DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION }, .prev_api = NULL },
	.managed_tensor_allocator = x_allocator,
	.managed_tensor_from_py_object_no_sync = x_from_py,
	.managed_tensor_to_py_object_no_sync = x_to_py,
	.dltensor_from_py_object_no_sync = x_dltensor,
	.current_work_stream = x_current_work_stream,
};

int td_exchange_api_publish(void)
{
	PyObject *api;

	/* The exchange table is a type attribute in both of its published forms. */
	api = PyCapsule_New((void *)&td_exchange_api, "dlpack_exchange_api", NULL);
	if (!api ||
	    PyDict_SetItemString(td_TensorType.tp_dict, "__dlpack_c_exchange_api__", api) < 0)
		return -1;
	Py_DECREF(api);
	api = PyLong_FromVoidPtr((void *)&td_exchange_api);
	if (!api ||
	    PyDict_SetItemString(td_TensorType.tp_dict, "__c_dlpack_exchange_api__", api) < 0)
		return -1;
	Py_DECREF(api);
	PyType_Modified(&td_TensorType);
	return 0;
}
