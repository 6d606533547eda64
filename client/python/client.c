/*
 * The tensord.Client type: one libtensord connection shared by any number
 * of Python threads. Each method parses its arguments with the GIL held,
 * then brackets the libtensord call with td_client_enter() and
 * td_client_leave(), releasing the GIL in between; close() from another
 * thread meanwhile only marks the client, and the last call to leave
 * closes it.
 */
#include "tdpy.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

unsigned td_py_forks;

/*
 * In a forked child, calls the parent had in flight are not running.
 * (libtensord itself sends the child's requests over a connection of its
 * own: docs/design.md, "Fork".)
 */
static void forget_parent_calls(ClientObject *self)
{
	if (self->forks != td_py_forks) {
		self->forks = td_py_forks;
		self->busy = 0;
	}
}

tensord_client *td_client_enter(ClientObject *self)
{
	forget_parent_calls(self);
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
	Py_BEGIN_ALLOW_THREADS tensord_close(c);
	Py_END_ALLOW_THREADS
}

int td_client_leave(ClientObject *self, int rc)
{
	/* Raise first: a close below may reset tensord_last_error(). */
	if (rc < 0)
		td_raise(rc);
	if (--self->busy == 0 && self->closing && self->c)
		client_close_now(self);
	return rc;
}

static PyObject *Client_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "path", "name", NULL };
	PyObject *path = Py_None, *bytes = NULL, *name = Py_None;
	tensord_client *c = NULL;
	const char *p = NULL, *label = NULL;
	ClientObject *self;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O$O:connect", kwlist, &path, &name))
		return NULL;
	if (name != Py_None) {
		if (!PyUnicode_Check(name))
			return PyErr_Format(PyExc_TypeError,
					    "name must be a str or None, not %.80s",
					    Py_TYPE(name)->tp_name);
		label = PyUnicode_AsUTF8(name);
		if (!label)
			return NULL;
	}
	if (path != Py_None) {
		if (!PyUnicode_FSConverter(path, &bytes))
			return NULL;
		p = PyBytes_AS_STRING(bytes);
	}
	Py_BEGIN_ALLOW_THREADS rc = tensord_connect_named(p, label, &c);
	Py_END_ALLOW_THREADS Py_XDECREF(bytes);
	if (rc < 0)
		return td_raise_connect(rc);
	self = (ClientObject *)type->tp_alloc(type, 0);
	if (!self) {
		tensord_close(c);
		return NULL;
	}
	self->c = c;
	self->path = Py_NewRef(path);
	self->forks = td_py_forks;
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
	forget_parent_calls(self);
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

double td_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int td_wait_slice(int ms, double deadline)
{
	double left;

	if (ms >= 0 && ms <= TD_WAIT_SLICE_MS)
		return ms;
	left = deadline - td_now_ms();
	return ms < 0 || left > TD_WAIT_SLICE_MS ? TD_WAIT_SLICE_MS : (left > 1 ? (int)left : 1);
}

bool td_wait_goes_on(tensord_client *c, int rc, unsigned seen, int ms, double deadline,
		     double *lost_since)
{
	const char *env = getenv("TENSORD_RECONNECT_MS");
	double grace = env && *env ? atof(env) : 30000.0, now = td_now_ms();
	int e = rc < 0 ? -rc : rc;

	if (e == ETIMEDOUT) {
		*lost_since = 0;
		return ms < 0 || now < deadline;
	}
	/* A daemon never answers ECONNREFUSED; the others it may, about a peer:
	 * then c's own connection is neither lost nor replaced since seen. */
	if (e != ECONNREFUSED && ((e != ECONNRESET && e != EPIPE && e != ECONNABORTED) ||
				  (tensord_epoch(c) == seen && !tensord_lost(c))))
		return false;
	/* The daemon went away: the wait goes on over a new connection (the
	 * next slice connects anew), for its timeout, or the grace without one. */
	if (!*lost_since)
		*lost_since = now;
	return (ms < 0 || now < deadline) && now - *lost_since < grace;
}

/*
 * tensord_attach() waiting in slices of TD_WAIT_SLICE_MS, so that Ctrl-C
 * (or any signal whose Python handler raises) interrupts a long wait at
 * once: -EINTR with the handler's exception set. ms: as tensord_attach().
 * Called and returns with the GIL held; waits without it.
 */
static int attach_interruptibly(tensord_client *c, const char *name, uint64_t after, int ms,
				DLManagedTensorVersioned **ret)
{
	double deadline = td_now_ms() + ms, lost_since = 0;
	unsigned epoch = tensord_epoch(c);
	uint64_t lineage = tensord_lineage(c);
	int rc;

	for (;;) {
		int slice = td_wait_slice(ms, deadline);
		unsigned seen = tensord_epoch(c);

		/* The daemon restarted empty since the wait began: after was the old one's. */
		if (seen != epoch && tensord_lineage(c) != lineage)
			after = 0;
		Py_BEGIN_ALLOW_THREADS rc = tensord_attach_after(c, name, after, slice, ret);
		Py_END_ALLOW_THREADS if (rc == 0 || slice == ms ||
					 !td_wait_goes_on(c, rc, seen, ms, deadline,
							  &lost_since)) return rc;
		if (PyErr_CheckSignals() < 0)
			return -EINTR;
	}
}

int td_parse_after(PyObject *o, uint64_t *ret)
{
	unsigned long long v;

	*ret = 0;
	if (o == Py_None)
		return 0;
	v = PyLong_AsUnsignedLongLong(o);
	if (v == (unsigned long long)-1 && PyErr_Occurred()) {
		PyErr_Clear();
		PyErr_Format(PyExc_ValueError, "after must be None or an int >= 0, not %R", o);
		return -1;
	}
	*ret = v;
	return 0;
}

int td_parse_wait(PyObject *timeout, PyObject *after, int *ms, uint64_t *ret_after)
{
	if (td_parse_after(after, ret_after) < 0 || td_parse_timeout(timeout, ms) < 0)
		return -1;
	/* Waiting for something newer: None waits for it, however long. */
	if (after != Py_None && timeout == Py_None)
		*ms = -1;
	return 0;
}

static PyObject *Client_attach(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "name", "timeout", "after", NULL };
	PyObject *timeout = Py_None, *after_o = Py_None;
	DLManagedTensorVersioned *mt = NULL;
	tensord_client *c;
	const char *name;
	uint64_t after;
	int ms, rc;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "s|O$O:attach", kwlist, &name, &timeout,
					 &after_o) ||
	    td_parse_wait(timeout, after_o, &ms, &after) < 0 || !(c = td_client_enter(self)))
		return NULL;
	rc = attach_interruptibly(c, name, after, ms, &mt);
	if (rc == -EINTR) {
		td_client_leave(self, 0);
		return NULL; /* the signal handler's exception (KeyboardInterrupt) */
	}
	if (td_client_leave(self, rc) < 0)
		return NULL;
	return td_tensor_new(mt, self);
}

static PyObject *Client_create(ClientObject *self, PyObject *args, PyObject *kwds)
{
	struct td_create_args a;
	DLManagedTensorVersioned *mt = NULL;
	tensord_client *c;
	int rc;

	if (td_parse_create(args, kwds, &a) < 0)
		return NULL;
	if (!(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = tensord_create(c, a.name, &a.spec, &mt);
	Py_END_ALLOW_THREADS if (td_client_leave(self, rc) < 0) return NULL;
	return td_tensor_new(mt, self);
}

static PyObject *Client_stat(ClientObject *self, PyObject *args)
{
	tensord_info info;
	tensord_client *c;
	const char *name;
	int rc;

	if (!PyArg_ParseTuple(args, "s:stat", &name) || !(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = tensord_stat(c, name, &info);
	Py_END_ALLOW_THREADS if (td_client_leave(self, rc) < 0) return NULL;
	return td_info_new(&info);
}

static PyObject *Client_list(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "prefix", NULL };
	const char *prefix = "";
	tensord_info *infos = NULL;
	size_t n = 0;
	tensord_client *c;
	PyObject *list;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|s:list", kwlist, &prefix) ||
	    !(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = tensord_list(c, prefix, &infos, &n);
	Py_END_ALLOW_THREADS if (td_client_leave(self, rc) < 0) return NULL;
	list = td_info_list(infos, n);
	free(infos);
	return list;
}

static PyObject *Client_stats(ClientObject *self, PyObject *unused)
{
	tensord_client *c;
	PyObject *json, *ret = NULL;
	char *text = NULL;
	int rc;

	if (!(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = tensord_stats_json(c, &text);
	Py_END_ALLOW_THREADS if (td_client_leave(self, rc) < 0) return NULL;
	/* The library writes the one shape tensorctl stats --json prints too. */
	json = PyImport_ImportModule("json");
	if (json)
		ret = PyObject_CallMethod(json, "loads", "s", text);
	Py_XDECREF(json);
	free(text);
	return ret;
}

static PyObject *Client_unlink(ClientObject *self, PyObject *args)
{
	tensord_client *c;
	const char *name;
	int rc;

	if (!PyArg_ParseTuple(args, "s:unlink", &name) || !(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = tensord_unlink(c, name);
	Py_END_ALLOW_THREADS if (td_client_leave(self, rc) < 0) return NULL;
	Py_RETURN_NONE;
}

static PyObject *Client_get_closed(ClientObject *self, void *unused)
{
	return PyBool_FromLong(!self->c || self->closing);
}

static PyObject *Client_get_path(ClientObject *self, void *unused)
{
	return Py_NewRef(self->path);
}

static PyMethodDef Client_methods[] = {
	{ "attach", (PyCFunction)(void (*)(void))Client_attach, METH_VARARGS | METH_KEYWORDS,
	  "attach($self, /, name, timeout=None, *, after=None)\n--\n\n"
	  "Returns a Tensor: attaches the published tensor `name`, zero copy. With timeout=None it "
	  "fails at once\n"
	  "(FileNotFoundError) when the name is not published; with a number of seconds it waits\n"
	  "that long for a publish (TimeoutError after), and math.inf waits forever. The Tensor\n"
	  "is read-only unless the tensor was created mutable and the caller may write it.\n"
	  "after: a generation; a newer one is attached at once when published, else waited for\n"
	  "(then timeout=None waits forever, 0 does not wait: TimeoutError)." },
	TD_SETS_METHODS{
		"create", (PyCFunction)(void (*)(void))Client_create, METH_VARARGS | METH_KEYWORDS,
		"create($self, /, name, shape, dtype, device='cpu', mutable=False,\n"
		"       lifetime='persistent', mode=None, strides=None, *, replace=False,\n"
		"       recycle=False)\n--\n\n"
		"Returns a Tensor: allocates a tensor in the daemon and returns it writable to the "
		"caller; nobody else\n"
		"sees it until Tensor.publish(). dtype is a name such as 'float32' (numpy and "
		"torch\n"
		"dtypes are accepted too); strides are in elements (default row-major compact);\n"
		"lifetime='connection' unlinks it when this client's connection closes; mode is\n"
		"permission bits as for files (default 0o600). replace=True takes over the name "
		"of\n"
		"a tensor the caller owns (see put)." },
	{ "put", (PyCFunction)(void (*)(void))td_client_put, METH_VARARGS | METH_KEYWORDS,
	  "put($self, /, name, obj, mutable=False, lifetime='persistent', mode=None, *,\n"
	  "    replace=False, sealed=False)\n--\n\n"
	  "Copies obj once into a new daemon tensor and publishes it. obj is any DLPack producer\n"
	  "in host memory (numpy, torch, jax arrays, a Tensor) or any object with the buffer\n"
	  "protocol (bytes, array.array, memoryview); a tensor that requires grad is detached\n"
	  "first. Any strides are accepted; the copy is\n"
	  "stored row-major compact. replace=True puts over an existing tensor of that name\n"
	  "that the caller owns (PermissionError if another user does): the daemon unlinks\n"
	  "it in the same step, and arrays or leases of the old tensor keep their bytes.\n"
	  "A large put may reuse memory of this writer's earlier versions whose leases all\n"
	  "ended (docs/recycle.md), host or CUDA (VMM path); sealed=True takes fresh memory\n"
	  "(sealed F_SEAL_WRITE on the host)." },
	{ "stat", (PyCFunction)Client_stat, METH_VARARGS,
	  "stat($self, name, /)\n--\n\n"
	  "Returns a TensorInfo describing one tensor (FileNotFoundError if there is none)." },
	{ "list", (PyCFunction)(void (*)(void))Client_list, METH_VARARGS | METH_KEYWORDS,
	  "list($self, /, prefix='')\n--\n\n"
	  "Returns a list of TensorInfo: describes every tensor whose name starts with prefix, in "
	  "name order." },
	{ "stats", (PyCFunction)Client_stats, METH_NOARGS,
	  "stats($self, /)\n--\n\n"
	  "Returns the daemon's figures as a dict, the object tensorctl stats --json prints:\n"
	  "each figure of the daemon by name ('tensors', 'host_pool_hits_total', ...), its\n"
	  "value or, with labels, a dict by label value ('requests_total': {'attach': 3});\n"
	  "'devices', a dict per device (device, backend, path, and each device_* figure);\n"
	  "'uids', a dict per uid (uid, and each uid_* figure; every uid for root, else the\n"
	  "caller's own). docs/operating.md lists every figure." },
	{ "leases", (PyCFunction)(void (*)(void))td_client_leases, METH_VARARGS | METH_KEYWORDS,
	  "leases($self, /, name=None)\n--\n\n"
	  "Returns a list of LeaseHolder: who holds leases on name (None: on every tensor): one "
	  "record per tensor and\n"
	  "connection, with pid, uid, gid, comm, count, since and held. Lists tensors the\n"
	  "caller may read; their owner and root see all." },
	{ "clients", (PyCFunction)td_client_clients, METH_NOARGS,
	  "clients($self, /)\n--\n\n"
	  "Returns a list of ClientInfo: the daemon's client connections, this one included: all "
	  "of them for root, those of\n"
	  "the caller's uid for anyone else." },
	{ "peers", (PyCFunction)td_client_peers, METH_NOARGS,
	  "peers($self, /)\n--\n\n"
	  "Returns a list of PeerInfo: the other nodes' daemons this one peers with, and their "
	  "state\n"
	  "(docs/operating.md, \"Peers\"). Root and the daemon's own uid only: PermissionError "
	  "for others." },
	{ "metrics", (PyCFunction)td_client_metrics, METH_NOARGS,
	  "metrics($self, /)\n--\n\n"
	  "Returns a str: the daemon's metrics in the Prometheus text format 0.0.4 (what --metrics "
	  "serves, with the per-uid rows stats() shows this uid)." },
	{ "unlink", (PyCFunction)Client_unlink, METH_VARARGS,
	  "unlink($self, name, /)\n--\n\n"
	  "Removes the name; the memory lives until the last lease on it ends." },
	{ "close", (PyCFunction)Client_close, METH_NOARGS,
	  "close($self, /)\n--\n\n"
	  "Closes the connection; the daemon ends this client's leases and unlinks its\n"
	  "connection-lifetime tensors. Arrays made from its tensors stay valid until they\n"
	  "die. Calls still running in other threads finish first. Idempotent." },
	{ "__enter__", (PyCFunction)Client_enter, METH_NOARGS,
	  "__enter__($self, /)\n--\n\nReturns self." },
	{ "__exit__", (PyCFunction)Client_exit, METH_VARARGS,
	  "__exit__($self, /, *exc_info)\n--\n\nCalls close()." },
	{ NULL },
};

static PyGetSetDef Client_getset[] = {
	{ "closed", (getter)Client_get_closed, NULL, "True once close() was called.", NULL },
	{ "path", (getter)Client_get_path, NULL,
	  "The socket path given to connect(), or None for the default.", NULL },
	{ NULL },
};

PyTypeObject td_ClientType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tensord.Client",
	.tp_basicsize = sizeof(ClientObject),
	.tp_dealloc = (destructor)Client_dealloc,
	.tp_repr = (reprfunc)Client_repr,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Client(path=None, *, name=None)\n--\n\n"
		  "A connection to a tensord daemon; tensord.connect() makes one. path=None tries\n"
		  "$TENSORD_SOCKET alone if set, else the path tensord itself would use\n"
		  "($XDG_RUNTIME_DIR/tensord.sock, /run/tensord/tensord.sock for root, else\n"
		  "/tmp/tensord-$UID/tensord.sock), then /run/tensord/tensord.sock. The socket\n"
		  "and the daemon must belong to you, root or $TENSORD_DAEMON_UID. Safe to share\n"
		  "between threads. A context manager that closes the connection on exit. name "
		  "labels\n"
		  "the connection for clients(), leases() and tensorctl (see connect()).",
	.tp_methods = Client_methods,
	.tp_getset = Client_getset,
	.tp_new = Client_new,
};
