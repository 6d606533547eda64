/*
 * tensord._tensord: the module, its errors, the TensorInfo record and the
 * Client type. Every libtensord call that talks to the daemon runs with
 * the GIL released; libtensord is thread-safe, so several Python threads may
 * share one Client.
 */
#include "tdpy.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <string.h>

/* The tensord.Error hierarchy; set once at module init, never freed. */
static PyObject *Error, *NotFoundError, *ExistsError, *TimedOutError, *AccessDeniedError,
	*NoDaemonError;

static PyObject *raise_as(PyObject *cls, int rc)
{
	const char *msg = tensord_last_error();
	PyObject *exc;

	if (!msg || !*msg)
		msg = tensord_strerror(rc);
	exc = PyObject_CallFunction(cls, "is", rc < 0 ? -rc : rc, msg);
	if (exc) {
		PyErr_SetObject(cls, exc);
		Py_DECREF(exc);
	}
	return NULL;
}

PyObject *td_raise(int rc)
{
	switch (rc < 0 ? -rc : rc) {
	case ENOENT:
		return raise_as(NotFoundError, rc);
	case EEXIST:
		return raise_as(ExistsError, rc);
	case ETIMEDOUT:
		return raise_as(TimedOutError, rc);
	case EPERM:
	case EACCES:
		return raise_as(AccessDeniedError, rc);
	case ECONNREFUSED:
		return raise_as(NoDaemonError, rc);
	case ENOMEM:
		return PyErr_NoMemory();
	default:
		return raise_as(Error, rc);
	}
}

/* --- TensorInfo records -------------------------------------------------- */

static PyStructSequence_Field info_fields[] = {
	{"name", "the tensor's name"},
	{"dtype", "element type, e.g. 'float32'"},
	{"shape", "tuple of dimensions"},
	{"strides", "tuple of strides, in elements"},
	{"device", "'cpu', 'cuda:0', ..."},
	{"nbytes", "bytes the daemon allocated for it"},
	{"state", "'created', 'published' or 'unlinked'"},
	{"refcount", "live leases"},
	{"owner_uid", "uid of the creator"},
	{"owner_gid", "gid of the creator"},
	{"mode", "permission bits, as for files"},
	{"mutable", "stays writable after publish"},
	{"lifetime", "'persistent' or 'connection'"},
	{"created", "creation time, seconds since the epoch"},
	{"id", "unique for the daemon's life"},
	{NULL, NULL},
};

static PyStructSequence_Desc info_desc = {
	"tensord.TensorInfo",
	"TensorInfo(name, dtype, shape, strides, device, nbytes, state, refcount, owner_uid, "
	"owner_gid, mode, mutable, lifetime, created, id)\n\n"
	"One tensor as the daemon describes it; returned by Client.stat() and Client.list().",
	info_fields,
	15,
};

PyTypeObject td_InfoType;

/* A tuple of Python ints from v[0..n); NULL with an exception set. */
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

PyObject *td_info_new(const tensord_info *in)
{
	static const char *const states[] = {"?", "created", "published", "unlinked"};
	char dtype[64], device[32];
	PyObject *r = PyStructSequence_New(&td_InfoType);
	PyObject *v[15];

	if (!r)
		return NULL;
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
	v[10] = PyLong_FromUnsignedLong(in->mode);
	v[11] = PyBool_FromLong(in->flags & TENSORD_MUTABLE);
	v[12] = PyUnicode_FromString(in->flags & TENSORD_LIFETIME_CONNECTION ? "connection"
										: "persistent");
	v[13] = PyFloat_FromDouble((double)in->created_ns / 1e9);
	v[14] = PyLong_FromUnsignedLongLong(in->id);
	for (int i = 0; i < 15; i++) {
		if (!v[i]) {
			for (int j = i + 1; j < 15; j++)
				Py_XDECREF(v[j]);
			Py_DECREF(r);
			return NULL;
		}
		PyStructSequence_SetItem(r, i, v[i]);
	}
	return r;
}

/* --- argument parsers ------------------------------------------------------ */

int td_parse_flags(PyObject *mutable_, PyObject *lifetime, PyObject *mode, uint32_t *flags,
		   uint32_t *mode_out)
{
	int m = mutable_ ? PyObject_IsTrue(mutable_) : 0;

	if (m < 0)
		return -1;
	*flags = m ? TENSORD_MUTABLE : 0;
	if (lifetime && lifetime != Py_None) {
		if (!PyUnicode_Check(lifetime))
			goto bad_lifetime;
		if (PyUnicode_CompareWithASCIIString(lifetime, "connection") == 0)
			*flags |= TENSORD_LIFETIME_CONNECTION;
		else if (PyUnicode_CompareWithASCIIString(lifetime, "persistent") != 0)
			goto bad_lifetime;
	}
	*mode_out = 0;
	if (mode && mode != Py_None) {
		long v = PyLong_AsLong(mode);

		if (v == -1 && PyErr_Occurred())
			return -1;
		if (v < 0 || v > 07777) {
			PyErr_Format(PyExc_ValueError, "mode must be permission bits 0..0o7777, not %ld",
				     v);
			return -1;
		}
		*mode_out = (uint32_t)v;
	}
	return 0;

bad_lifetime:
	PyErr_Format(PyExc_ValueError, "lifetime must be 'persistent' or 'connection', not %R",
		     lifetime);
	return -1;
}

/*
 * dtype: a string ("float32"), or anything whose .name or str() is one, so
 * numpy dtypes and torch dtypes ("torch.float32") work too.
 */
static int parse_dtype(PyObject *o, DLDataType *ret)
{
	PyObject *s = NULL;
	const char *txt;
	int rc;

	if (PyUnicode_Check(o)) {
		s = Py_NewRef(o);
	} else {
		PyObject *name = PyObject_GetAttrString(o, "name");

		if (name && PyUnicode_Check(name)) {
			s = name;
		} else {
			Py_XDECREF(name);
			PyErr_Clear();
			s = PyObject_Str(o);
		}
	}
	if (!s || !(txt = PyUnicode_AsUTF8(s))) {
		Py_XDECREF(s);
		return -1;
	}
	if (strncmp(txt, "torch.", 6) == 0)
		txt += 6;
	rc = tensord_dtype_parse(txt, ret);
	if (rc < 0)
		PyErr_Format(PyExc_ValueError,
			     "unknown dtype %R: use bool, int8..int64, uint8..uint64, float16, "
			     "bfloat16, float32, float64, complex64 or complex128",
			     o);
	Py_DECREF(s);
	return rc < 0 ? -1 : 0;
}

static int parse_device(PyObject *o, DLDevice *ret)
{
	PyObject *s = PyUnicode_Check(o) ? Py_NewRef(o) : PyObject_Str(o);
	const char *txt = s ? PyUnicode_AsUTF8(s) : NULL;
	int rc = txt ? tensord_device_parse(txt, ret) : -1;

	if (txt && rc < 0)
		PyErr_Format(PyExc_ValueError, "unknown device %R: use 'cpu', 'cuda:N' or 'rocm:N'",
			     o);
	Py_XDECREF(s);
	return rc < 0 ? -1 : 0;
}

/* An int or a sequence of at most TENSORD_NDIM_MAX ints; returns ndim or -1. */
static int parse_dims(PyObject *o, const char *what, int64_t *out)
{
	PyObject *seq;
	Py_ssize_t n;

	if (PyLong_Check(o)) {
		out[0] = PyLong_AsLongLong(o);
		return out[0] == -1 && PyErr_Occurred() ? -1 : 1;
	}
	seq = PySequence_Fast(o, "");
	if (!seq) {
		PyErr_Format(PyExc_TypeError, "%s must be a sequence of ints, not %.100s", what,
			     Py_TYPE(o)->tp_name);
		return -1;
	}
	n = PySequence_Fast_GET_SIZE(seq);
	if (n > TENSORD_NDIM_MAX) {
		PyErr_Format(PyExc_ValueError, "%s has %zd dimensions; at most %d are allowed", what,
			     n, TENSORD_NDIM_MAX);
		Py_DECREF(seq);
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
		if (out[i] == -1 && PyErr_Occurred()) {
			Py_DECREF(seq);
			return -1;
		}
	}
	Py_DECREF(seq);
	return (int)n;
}

/* None: do not wait; seconds: wait that long; math.inf: wait forever. */
static int parse_timeout(PyObject *o, int *ms)
{
	double s;

	if (o == Py_None) {
		*ms = 0;
		return 0;
	}
	s = PyFloat_AsDouble(o);
	if (s == -1.0 && PyErr_Occurred())
		return -1;
	if (isnan(s) || s < 0) {
		PyErr_SetString(PyExc_ValueError, "timeout must be None or a number of seconds >= 0");
		return -1;
	}
	*ms = s * 1000.0 >= (double)INT_MAX ? -1 : (int)ceil(s * 1000.0);
	return 0;
}

/* --- Client ---------------------------------------------------------------- */

tensord_client *td_client_enter(ClientObject *self)
{
	if (!self->c || self->closing) {
		PyErr_SetString(PyExc_ValueError, "operation on a closed tensord client");
		return NULL;
	}
	self->busy++;
	return self->c;
}

static void client_close_now(ClientObject *self)
{
	tensord_client *c = self->c;

	self->c = NULL;
	Py_BEGIN_ALLOW_THREADS
	tensord_close(c);
	Py_END_ALLOW_THREADS
}

void td_client_leave(ClientObject *self)
{
	if (--self->busy == 0 && self->closing && self->c)
		client_close_now(self);
}

static PyObject *Client_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"path", NULL};
	PyObject *path = Py_None, *bytes = NULL;
	tensord_client *c = NULL;
	const char *p = NULL;
	ClientObject *self;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:connect", kwlist, &path))
		return NULL;
	if (path != Py_None) {
		if (!PyUnicode_FSConverter(path, &bytes))
			return NULL;
		p = PyBytes_AS_STRING(bytes);
	}
	Py_BEGIN_ALLOW_THREADS
	rc = tensord_connect(p, &c);
	Py_END_ALLOW_THREADS
	Py_XDECREF(bytes);
	if (rc < 0)
		return rc == -ENOENT ? raise_as(NoDaemonError, rc) : td_raise(rc);
	self = (ClientObject *)type->tp_alloc(type, 0);
	if (!self) {
		tensord_close(c);
		return NULL;
	}
	self->c = c;
	self->path = Py_NewRef(path);
	return (PyObject *)self;
}

static void Client_dealloc(ClientObject *self)
{
	/* busy is 0 here: every call in flight holds a reference to self. */
	tensord_close(self->c);
	Py_XDECREF(self->path);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Client_repr(ClientObject *self)
{
	return PyUnicode_FromFormat("<tensord.Client path=%R%s>", self->path,
				    self->c && !self->closing ? "" : " closed");
}

static PyObject *Client_close(ClientObject *self, PyObject *unused)
{
	self->closing = true;
	if (self->busy == 0 && self->c)
		client_close_now(self);
	Py_RETURN_NONE;
}

static PyObject *Client_enter(ClientObject *self, PyObject *unused)
{
	if (!self->c || self->closing) {
		PyErr_SetString(PyExc_ValueError, "operation on a closed tensord client");
		return NULL;
	}
	return Py_NewRef(self);
}

static PyObject *Client_exit(ClientObject *self, PyObject *args)
{
	return Client_close(self, NULL);
}

static PyObject *Client_attach(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"name", "timeout", NULL};
	PyObject *timeout = Py_None;
	DLManagedTensorVersioned *mt = NULL;
	tensord_client *c;
	const char *name;
	int ms, rc;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "s|O:attach", kwlist, &name, &timeout) ||
	    parse_timeout(timeout, &ms) < 0 || !(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = tensord_attach(c, name, ms, &mt);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		td_raise(rc);
	td_client_leave(self);
	return rc < 0 ? NULL : td_tensor_new(mt, self);
}

static PyObject *Client_create(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"name", "shape", "dtype", "device", "mutable", "lifetime",
				 "mode", "strides", NULL};
	PyObject *shape_o, *dtype_o, *device_o = NULL, *mutable_o = NULL, *lifetime_o = NULL,
		*mode_o = NULL, *strides_o = Py_None;
	int64_t shape[TENSORD_NDIM_MAX], strides[TENSORD_NDIM_MAX];
	tensord_spec spec = {.device = {kDLCPU, 0}};
	DLManagedTensorVersioned *mt = NULL;
	tensord_client *c;
	const char *name;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "sOO|OOOOO:create", kwlist, &name, &shape_o,
					 &dtype_o, &device_o, &mutable_o, &lifetime_o, &mode_o,
					 &strides_o))
		return NULL;
	if ((spec.ndim = parse_dims(shape_o, "shape", shape)) < 0 ||
	    parse_dtype(dtype_o, &spec.dtype) < 0 ||
	    (device_o && parse_device(device_o, &spec.device) < 0) ||
	    td_parse_flags(mutable_o, lifetime_o, mode_o, &spec.flags, &spec.mode) < 0)
		return NULL;
	spec.shape = spec.ndim ? shape : NULL;
	if (strides_o != Py_None) {
		int n = parse_dims(strides_o, "strides", strides);

		if (n < 0)
			return NULL;
		if (n != spec.ndim)
			return PyErr_Format(PyExc_ValueError,
					    "strides has %d entries but shape has %d", n,
					    spec.ndim);
		spec.strides = spec.ndim ? strides : NULL;
	}
	if (!(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = tensord_create(c, name, &spec, &mt);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		td_raise(rc);
	td_client_leave(self);
	return rc < 0 ? NULL : td_tensor_new(mt, self);
}

static PyObject *Client_stat(ClientObject *self, PyObject *args)
{
	tensord_info info;
	tensord_client *c;
	const char *name;
	int rc;

	if (!PyArg_ParseTuple(args, "s:stat", &name) || !(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = tensord_stat(c, name, &info);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		td_raise(rc);
	td_client_leave(self);
	return rc < 0 ? NULL : td_info_new(&info);
}

static PyObject *Client_list(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"prefix", NULL};
	const char *prefix = "";
	tensord_info *infos = NULL;
	size_t n = 0;
	tensord_client *c;
	PyObject *list;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|s:list", kwlist, &prefix) ||
	    !(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = tensord_list(c, prefix, &infos, &n);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		td_raise(rc);
	td_client_leave(self);
	if (rc < 0)
		return NULL;
	list = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; list && i < n; i++) {
		PyObject *r = td_info_new(&infos[i]);

		if (!r)
			Py_CLEAR(list);
		else
			PyList_SET_ITEM(list, (Py_ssize_t)i, r);
	}
	free(infos);
	return list;
}

static PyObject *Client_stats(ClientObject *self, PyObject *unused)
{
	tensord_daemon_stats st;
	tensord_client *c;
	PyObject *devs, *d;
	int rc;

	if (!(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = tensord_stats(c, &st, sizeof(st));
	Py_END_ALLOW_THREADS
	if (rc < 0)
		td_raise(rc);
	td_client_leave(self);
	if (rc < 0)
		return NULL;
	if (!(devs = PyList_New(0)))
		return NULL;
	for (uint32_t i = 0; i < st.n_devices && i < TENSORD_STATS_DEVICES_MAX; i++) {
		const tensord_device_stats *ds = &st.devices[i];
		char dev[32];

		d = Py_BuildValue("{s:s,s:s,s:s,s:K,s:K,s:I}", "device",
				  tensord_device_name(ds->device, dev, sizeof(dev)), "backend",
				  ds->backend, "path", ds->path, "bytes_used",
				  (unsigned long long)ds->bytes_used, "bytes_capacity",
				  (unsigned long long)ds->bytes_capacity, "tensors", ds->tensors);
		if (!d || PyList_Append(devs, d) < 0) {
			Py_XDECREF(d);
			Py_DECREF(devs);
			return NULL;
		}
		Py_DECREF(d);
	}
	return Py_BuildValue("{s:K,s:K,s:K,s:d,s:I,s:N}", "tensors",
			     (unsigned long long)st.tensors, "clients",
			     (unsigned long long)st.clients, "leases", (unsigned long long)st.leases,
			     "uptime", (double)st.uptime_ns / 1e9, "daemon_pid", st.daemon_pid,
			     "devices", devs);
}

static PyObject *Client_unlink(ClientObject *self, PyObject *args)
{
	tensord_client *c;
	const char *name;
	int rc;

	if (!PyArg_ParseTuple(args, "s:unlink", &name) || !(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS
	rc = tensord_unlink(c, name);
	Py_END_ALLOW_THREADS
	if (rc < 0)
		td_raise(rc);
	td_client_leave(self);
	if (rc < 0)
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *Client_get_closed(ClientObject *self, void *unused)
{
	return PyBool_FromLong(!self->c || self->closing);
}

static PyMethodDef Client_methods[] = {
	{"attach", (PyCFunction)(void (*)(void))Client_attach, METH_VARARGS | METH_KEYWORDS,
	 "attach(name, timeout=None) -> Tensor\n\n"
	 "Attaches the published tensor `name`, zero copy. With timeout=None it fails at once\n"
	 "(FileNotFoundError) when the name is not published; with a number of seconds it waits\n"
	 "that long for a publish (TimeoutError after), and math.inf waits forever. The Tensor\n"
	 "is read-only unless the tensor was created mutable and the caller may write it."},
	{"create", (PyCFunction)(void (*)(void))Client_create, METH_VARARGS | METH_KEYWORDS,
	 "create(name, shape, dtype, device='cpu', mutable=False, lifetime='persistent',\n"
	 "       mode=None, strides=None) -> Tensor\n\n"
	 "Allocates a tensor in the daemon and returns it writable to the caller; nobody else\n"
	 "sees it until Tensor.publish(). dtype is a name such as 'float32' (numpy and torch\n"
	 "dtypes are accepted too); strides are in elements (default row-major compact);\n"
	 "lifetime='connection' unlinks it when this client's connection closes; mode is\n"
	 "permission bits as for files (default 0o600)."},
	{"put", (PyCFunction)(void (*)(void))td_client_put, METH_VARARGS | METH_KEYWORDS,
	 "put(name, obj, mutable=False, lifetime='persistent', mode=None) -> None\n\n"
	 "Copies obj once into a new daemon tensor and publishes it. obj is any DLPack producer\n"
	 "in host memory (numpy, torch, jax arrays, a Tensor) or any object with the buffer\n"
	 "protocol (bytes, array.array, memoryview). Any strides are accepted; the copy is\n"
	 "stored row-major compact."},
	{"stat", (PyCFunction)Client_stat, METH_VARARGS,
	 "stat(name) -> TensorInfo\n\nDescribes one tensor (FileNotFoundError if there is none)."},
	{"list", (PyCFunction)(void (*)(void))Client_list, METH_VARARGS | METH_KEYWORDS,
	 "list(prefix='') -> list[TensorInfo]\n\n"
	 "Describes every tensor whose name starts with prefix, in name order."},
	{"stats", (PyCFunction)Client_stats, METH_NOARGS,
	 "stats() -> dict\n\n"
	 "Daemon totals: tensors, clients, leases, uptime (seconds), daemon_pid, and devices,\n"
	 "a list of dicts with device, backend, path, bytes_used, bytes_capacity, tensors."},
	{"unlink", (PyCFunction)Client_unlink, METH_VARARGS,
	 "unlink(name) -> None\n\n"
	 "Removes the name; the memory lives until the last lease on it ends."},
	{"close", (PyCFunction)Client_close, METH_NOARGS,
	 "close() -> None\n\n"
	 "Closes the connection; the daemon ends this client's leases and unlinks its\n"
	 "connection-lifetime tensors. Arrays made from its tensors stay valid until they\n"
	 "die. Calls still running in other threads finish first. Idempotent."},
	{"__enter__", (PyCFunction)Client_enter, METH_NOARGS, "Returns self."},
	{"__exit__", (PyCFunction)Client_exit, METH_VARARGS, "Calls close()."},
	{NULL},
};

static PyObject *Client_get_path(ClientObject *self, void *unused)
{
	return Py_NewRef(self->path);
}

static PyGetSetDef Client_getset[] = {
	{"closed", (getter)Client_get_closed, NULL, "True once close() was called.", NULL},
	{"path", (getter)Client_get_path, NULL,
	 "The socket path given to connect(), or None for the default.", NULL},
	{NULL},
};

PyTypeObject td_ClientType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tensord.Client",
	.tp_basicsize = sizeof(ClientObject),
	.tp_dealloc = (destructor)Client_dealloc,
	.tp_repr = (reprfunc)Client_repr,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Client(path=None)\n\n"
		  "A connection to a tensord daemon; tensord.connect() makes one. path=None finds\n"
		  "the daemon as tensord does: $TENSORD_SOCKET, $XDG_RUNTIME_DIR/tensord.sock, then\n"
		  "/tmp/tensord-$UID.sock. Safe to share between threads. A context manager that\n"
		  "closes the connection on exit.",
	.tp_methods = Client_methods,
	.tp_getset = Client_getset,
	.tp_new = Client_new,
};

/* --- the module ---------------------------------------------------------- */

static PyObject *mod_connect(PyObject *mod, PyObject *args, PyObject *kwds)
{
	return PyObject_Call((PyObject *)&td_ClientType, args, kwds);
}

static PyObject *mod_default_socket_path(PyObject *mod, PyObject *unused)
{
	char buf[4096];
	int rc = tensord_default_socket_path(buf, sizeof(buf));

	return rc < 0 ? td_raise(rc) : PyUnicode_DecodeFSDefault(buf);
}

static PyMethodDef mod_methods[] = {
	{"connect", (PyCFunction)(void (*)(void))mod_connect, METH_VARARGS | METH_KEYWORDS,
	 "connect(path=None) -> Client\n\n"
	 "Connects to the tensord daemon at path, or, with None, at the default socket path\n"
	 "(see default_socket_path()). Raises ConnectionRefusedError (tensord.NoDaemonError)\n"
	 "when no daemon listens there."},
	{"default_socket_path", mod_default_socket_path, METH_NOARGS,
	 "default_socket_path() -> str\n\nThe socket path connect() uses when given None."},
	{NULL},
};

static struct PyModuleDef moddef = {
	PyModuleDef_HEAD_INIT,
	.m_name = "tensord._tensord",
	.m_doc = "The C part of the tensord Python client; import tensord instead.",
	.m_size = -1,
	.m_methods = mod_methods,
};

static PyObject *new_error(PyObject *mod, const char *name, PyObject *builtin, const char *doc)
{
	char qual[64];
	PyObject *bases, *cls;

	snprintf(qual, sizeof(qual), "tensord.%s", name);
	bases = builtin ? PyTuple_Pack(2, Error, builtin) : PyTuple_Pack(1, PyExc_OSError);
	if (!bases)
		return NULL;
	cls = PyErr_NewExceptionWithDoc(qual, doc, bases, NULL);
	Py_DECREF(bases);
	if (cls && PyModule_AddObjectRef(mod, name, cls) < 0)
		Py_CLEAR(cls);
	return cls;
}

PyMODINIT_FUNC PyInit__tensord(void)
{
	PyObject *mod, *api;

	if (td_InfoType.tp_name == NULL && PyStructSequence_InitType2(&td_InfoType, &info_desc) < 0)
		return NULL;
	if (PyType_Ready(&td_ClientType) < 0 || PyType_Ready(&td_TensorType) < 0)
		return NULL;

	/* The exchange table is a type attribute in both of its published forms. */
	api = PyCapsule_New((void *)&td_exchange_api, "dlpack_exchange_api", NULL);
	if (!api || PyDict_SetItemString(td_TensorType.tp_dict, "__dlpack_c_exchange_api__", api) < 0)
		return NULL;
	Py_DECREF(api);
	api = PyLong_FromVoidPtr((void *)&td_exchange_api);
	if (!api || PyDict_SetItemString(td_TensorType.tp_dict, "__c_dlpack_exchange_api__", api) < 0)
		return NULL;
	Py_DECREF(api);
	PyType_Modified(&td_TensorType);

	if (!(mod = PyModule_Create(&moddef)))
		return NULL;
	if (PyModule_AddObjectRef(mod, "Client", (PyObject *)&td_ClientType) < 0 ||
	    PyModule_AddObjectRef(mod, "Tensor", (PyObject *)&td_TensorType) < 0 ||
	    PyModule_AddObjectRef(mod, "TensorInfo", (PyObject *)&td_InfoType) < 0 ||
	    PyModule_AddIntConstant(mod, "DLPACK_MAJOR_VERSION", DLPACK_MAJOR_VERSION) < 0 ||
	    PyModule_AddIntConstant(mod, "DLPACK_MINOR_VERSION", DLPACK_MINOR_VERSION) < 0 ||
	    PyModule_AddIntConstant(mod, "PROTOCOL_VERSION", TENSORD_PROTOCOL_VERSION) < 0)
		goto fail;

	if (!Error) {
		Error = new_error(mod, "Error", NULL,
				  "Base of every tensord error; an OSError whose errno is the\n"
				  "daemon's code and whose message names the tensor and the reason.");
		if (!Error)
			goto fail;
		NotFoundError = new_error(mod, "NotFoundError", PyExc_FileNotFoundError,
					  "No such tensor (ENOENT).");
		ExistsError = new_error(mod, "ExistsError", PyExc_FileExistsError,
					"The name is taken (EEXIST).");
		TimedOutError = new_error(mod, "TimedOutError", PyExc_TimeoutError,
					  "attach() waited its timeout out (ETIMEDOUT).");
		AccessDeniedError = new_error(mod, "AccessDeniedError", PyExc_PermissionError,
					      "Refused by the tensor's owner or mode (EPERM, EACCES).");
		NoDaemonError = new_error(mod, "NoDaemonError", PyExc_ConnectionRefusedError,
					  "No daemon listens on the socket (ECONNREFUSED, ENOENT).");
		if (!NotFoundError || !ExistsError || !TimedOutError || !AccessDeniedError ||
		    !NoDaemonError)
			goto fail;
	} else if (PyModule_AddObjectRef(mod, "Error", Error) < 0 ||
		   PyModule_AddObjectRef(mod, "NotFoundError", NotFoundError) < 0 ||
		   PyModule_AddObjectRef(mod, "ExistsError", ExistsError) < 0 ||
		   PyModule_AddObjectRef(mod, "TimedOutError", TimedOutError) < 0 ||
		   PyModule_AddObjectRef(mod, "AccessDeniedError", AccessDeniedError) < 0 ||
		   PyModule_AddObjectRef(mod, "NoDaemonError", NoDaemonError) < 0) {
		goto fail;
	}
	return mod;

fail:
	Py_DECREF(mod);
	return NULL;
}
