/*
 * What the Client hands back as plain data: the tensord.TensorInfo record
 * (stat(), list()) and the shape/strides tuples the
 * Tensor type shares. Pure conversions of libtensord structs; no calls to
 * the daemon.
 */
#include "tdpy.h"

static PyStructSequence_Field info_fields[] = {
	{ "name", "the tensor's name" },
	{ "dtype", "element type, e.g. 'float32'" },
	{ "shape", "tuple of dimensions" },
	{ "strides", "tuple of strides, in elements" },
	{ "device", "'cpu', 'cuda:0', ..." },
	{ "nbytes", "bytes the daemon allocated for it" },
	{ "state", "'created', 'published' or 'unlinked'" },
	{ "refcount", "live leases" },
	{ "owner_uid", "uid of the creator" },
	{ "owner_gid", "gid of the creator" },
	{ "mode", "permission bits, as for files: an int shown in octal (0o600)" },
	{ "mutable", "stays writable after publish" },
	{ "lifetime", "'persistent' or 'connection'" },
	{ "created", "creation time, seconds since the epoch" },
	{ "id", "unique for the daemon's life" },
	{ "generation", "this publish's generation of the name: 1, 2, ...; 0 before publish" },
	{ "commit", "the daemon-wide commit that published it; 0 before publish" },
	{ NULL, NULL },
};

static PyStructSequence_Desc info_desc = {
	"tensord.TensorInfo",
	"TensorInfo(name, dtype, shape, strides, device, nbytes, state, refcount, owner_uid, "
	"owner_gid, mode, mutable, lifetime, created, id, generation, commit)\n\n"
	"One tensor as the daemon describes it; returned by Client.stat() and Client.list().",
	info_fields,
	17,
};

PyTypeObject td_InfoType;

/*
 * TensorInfo.mode: an int that shows itself in octal, as permission bits
 * are written (repr and str give 0o600; ==, arithmetic, %d, json and
 * format(m, 'o') are int's). Pickles as a plain int.
 */
static PyObject *Mode_repr(PyObject *self)
{
	unsigned long v = PyLong_AsUnsignedLong(self);
	char buf[32];

	if (v == (unsigned long)-1 && PyErr_Occurred())
		return NULL;
	snprintf(buf, sizeof(buf), "0o%03lo", v);
	return PyUnicode_FromString(buf);
}

static PyObject *Mode_reduce(PyObject *self, PyObject *unused)
{
	return Py_BuildValue("O(N)", (PyObject *)&PyLong_Type, PyNumber_Long(self));
}

static PyMethodDef Mode_methods[] = {
	{ "__reduce__", Mode_reduce, METH_NOARGS,
	  "__reduce__($self, /)\n--\n\nPickles as an int." },
	{ NULL },
};

static PyTypeObject ModeType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tensord.Mode",
	.tp_doc = "Permission bits: an int whose repr is octal (0o600).",
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_repr = Mode_repr,
	.tp_methods = Mode_methods,
};

int td_info_type_ready(void)
{
	ModeType.tp_base = &PyLong_Type;
	if (PyType_Ready(&ModeType) < 0)
		return -1;
	if (td_InfoType.tp_name == NULL && PyStructSequence_InitType2(&td_InfoType, &info_desc) < 0)
		return -1;
	return 0;
}

PyObject *td_dims_tuple(const int64_t *v, int n)
{
	PyObject *t = PyTuple_New(n);

	for (int i = 0; t && i < n; i++) {
		PyObject *x = PyLong_FromLongLong(v[i]);

		if (!x) {
			Py_CLEAR(t);
			break;
		}
		PyTuple_SET_ITEM(t, i, x);
	}
	return t;
}

PyObject *td_record_new(PyTypeObject *type, PyObject **v, int n)
{
	PyObject *r = PyStructSequence_New(type);

	for (int i = 0; i < n; i++) {
		if (!r || !v[i]) {
			for (int j = 0; j < n; j++)
				Py_XDECREF(v[j]);
			Py_XDECREF(r);
			return NULL;
		}
	}
	for (int i = 0; i < n; i++)
		PyStructSequence_SetItem(r, i, v[i]);
	return r;
}

PyObject *td_info_new(const tensord_info *in)
{
	static const char *const states[] = { "?", "created", "published", "unlinked" };
	char dtype[64], device[32];
	PyObject *v[17];

	v[0] = PyUnicode_FromString(in->name);
	v[1] = PyUnicode_FromString(tensord_dtype_name(in->dtype, dtype, sizeof(dtype)));
	v[2] = td_dims_tuple(in->shape, in->ndim);
	v[3] = td_dims_tuple(in->strides, in->ndim);
	v[4] = PyUnicode_FromString(tensord_device_name(in->device, device, sizeof(device)));
	v[5] = PyLong_FromUnsignedLongLong(in->nbytes);
	v[6] = PyUnicode_FromString(states[(unsigned)in->state <= 3 ? in->state : 0]);
	v[7] = PyLong_FromUnsignedLong(in->refcount);
	v[8] = PyLong_FromUnsignedLong(in->owner_uid);
	v[9] = PyLong_FromUnsignedLong(in->owner_gid);
	v[10] = PyObject_CallFunction((PyObject *)&ModeType, "k", (unsigned long)in->mode);
	v[11] = PyBool_FromLong(in->flags & TENSORD_MUTABLE);
	v[12] = PyUnicode_FromString(in->flags & TENSORD_LIFETIME_CONNECTION ? "connection"
									     : "persistent");
	v[13] = PyFloat_FromDouble((double)in->created_ns / 1e9);
	v[14] = PyLong_FromUnsignedLongLong(in->id);
	v[15] = PyLong_FromUnsignedLongLong(in->generation);
	v[16] = PyLong_FromUnsignedLongLong(in->commit);
	return td_record_new(&td_InfoType, v, 17);
}

PyObject *td_info_list(const tensord_info *infos, size_t n)
{
	PyObject *list = PyList_New((Py_ssize_t)n);

	for (size_t i = 0; list && i < n; i++) {
		PyObject *r = td_info_new(&infos[i]);

		if (!r)
			Py_CLEAR(list);
		else
			PyList_SET_ITEM(list, (Py_ssize_t)i, r);
	}
	return list;
}
