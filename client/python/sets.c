/*
 * Versions, sets and watches for Python (docs/python.md): Client.transaction()
 * and the Transaction type, Client.put_many(), Client.attach_many(),
 * Client.watch() with the Watch and Event types, and the operations
 * tensord.aio drives from an event loop (Client._attach_start() and
 * friends, the Op type). Each libtensord call that talks to the daemon runs
 * with the GIL released, between td_client_enter() and td_client_leave().
 */
#include "tdpy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* --- Event ------------------------------------------------------------------------- */

static PyStructSequence_Field event_fields[] = {
	{ "kind", "'published', 'unlinked' or 'lagged' (events were dropped or coalesced)" },
	{ "name", "the tensor's name ('' for lagged)" },
	{ "generation", "published: the new generation; unlinked: the one unlinked" },
	{ "commit", "the daemon-wide commit" },
	{ NULL, NULL },
};

static PyStructSequence_Desc event_desc = {
	"tensord.Event",
	"Event(kind, name, generation, commit)\n\nOne change a watch reports.",
	event_fields,
	4,
};

PyTypeObject td_EventType;

static PyObject *event_new(const tensord_event *e)
{
	static const char *const kinds[] = { "published", "unlinked", "lagged" };
	PyObject *v[4];

	v[0] = PyUnicode_FromString(kinds[(unsigned)e->kind <= 2 ? e->kind : 2]);
	v[1] = PyUnicode_FromString(e->name);
	v[2] = PyLong_FromUnsignedLongLong(e->generation);
	v[3] = PyLong_FromUnsignedLongLong(e->commit);
	return td_record_new(&td_EventType, v, 4);
}

/* --- Transaction ------------------------------------------------------------------- */

typedef struct {
	PyObject_HEAD ClientObject *client; /* strong */
	tensord_tx *tx;                     /* owned; NULL once freed */
	PyObject *commit_id;                /* None until committed */
	bool over;
} TxObject;

static PyTypeObject td_TxType;

static int tx_open(TxObject *self)
{
	if (!self->tx || self->over) {
		PyErr_SetString(PyExc_ValueError, "the transaction is over (committed or aborted)");
		return -1;
	}
	return 0;
}

static PyObject *Tx_put(TxObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "name", "obj", "mutable", "lifetime", "mode", "replace", NULL };
	PyObject *obj, *mutable_o = NULL, *lifetime_o = NULL, *mode_o = NULL;
	struct td_source s = { 0 };
	const char *name;
	uint32_t flags, mode;
	int rc, replace = 0;

	if (tx_open(self) < 0 ||
	    !PyArg_ParseTupleAndKeywords(args, kwds, "sO|OOO$p:put", kwlist, &name, &obj,
					 &mutable_o, &lifetime_o, &mode_o, &replace) ||
	    td_parse_flags(mutable_o, lifetime_o, mode_o, &flags, &mode) < 0)
		return NULL;
	if (replace)
		flags |= TENSORD_REPLACE;
	if (td_source_from(&s, obj) < 0 || !td_client_enter(self->client)) {
		td_source_release(&s);
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS rc = tensord_tx_put(self->tx, name, &s.dl, flags, mode);
	Py_END_ALLOW_THREADS rc = td_put_leave(self->client, rc);
	td_source_release(&s);
	if (rc < 0)
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *Tx_create(TxObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "name",     "shape", "dtype",   "device",  "mutable",
				  "lifetime", "mode",  "strides", "replace", NULL };
	PyObject *shape_o, *dtype_o, *device_o = NULL, *mutable_o = NULL, *lifetime_o = NULL,
				     *mode_o = NULL, *strides_o = Py_None;
	int64_t shape[TENSORD_NDIM_MAX], strides[TENSORD_NDIM_MAX];
	tensord_spec spec = { .device = { kDLCPU, 0 } };
	DLManagedTensorVersioned *mt = NULL;
	const char *name;
	int rc, replace = 0;

	if (tx_open(self) < 0 ||
	    !PyArg_ParseTupleAndKeywords(args, kwds, "sOO|OOOOO$p:create", kwlist, &name, &shape_o,
					 &dtype_o, &device_o, &mutable_o, &lifetime_o, &mode_o,
					 &strides_o, &replace))
		return NULL;
	if ((spec.ndim = td_parse_dims(shape_o, "shape", shape)) < 0 ||
	    td_parse_dtype(dtype_o, &spec.dtype) < 0 ||
	    (device_o && td_parse_device(device_o, &spec.device) < 0) ||
	    td_parse_flags(mutable_o, lifetime_o, mode_o, &spec.flags, &spec.mode) < 0)
		return NULL;
	spec.shape = spec.ndim ? shape : NULL;
	if (replace)
		spec.flags |= TENSORD_REPLACE;
	if (strides_o != Py_None) {
		int n = td_parse_dims(strides_o, "strides", strides);

		if (n < 0)
			return NULL;
		if (n != spec.ndim)
			return PyErr_Format(PyExc_ValueError,
					    "strides has %d entries but shape has %d", n,
					    spec.ndim);
		spec.strides = spec.ndim ? strides : NULL;
	}
	if (!td_client_enter(self->client))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = tensord_tx_create(self->tx, name, &spec, &mt);
	Py_END_ALLOW_THREADS if (td_client_leave(self->client, rc) < 0) return NULL;
	return td_tensor_new(mt, self->client);
}

static PyObject *Tx_unlink(TxObject *self, PyObject *args)
{
	const char *name;
	int rc;

	if (tx_open(self) < 0 || !PyArg_ParseTuple(args, "s:unlink", &name) ||
	    !td_client_enter(self->client))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = tensord_tx_unlink(self->tx, name);
	Py_END_ALLOW_THREADS if (td_client_leave(self->client, rc) < 0) return NULL;
	Py_RETURN_NONE;
}

static PyObject *Tx_commit(TxObject *self, PyObject *unused)
{
	uint64_t commit = 0;
	int rc;

	if (tx_open(self) < 0 || !td_client_enter(self->client))
		return NULL;
	self->over = true;
	Py_BEGIN_ALLOW_THREADS rc = tensord_tx_commit(self->tx, &commit);
	Py_END_ALLOW_THREADS if (td_client_leave(self->client, rc) < 0) return NULL;
	Py_XSETREF(self->commit_id, PyLong_FromUnsignedLongLong(commit));
	return Py_XNewRef(self->commit_id);
}

static PyObject *Tx_abort(TxObject *self, PyObject *unused)
{
	int rc;

	if (!self->tx || self->over)
		Py_RETURN_NONE;
	if (!td_client_enter(self->client))
		return NULL;
	self->over = true;
	Py_BEGIN_ALLOW_THREADS rc = tensord_tx_abort(self->tx);
	Py_END_ALLOW_THREADS if (td_client_leave(self->client, rc) < 0) return NULL;
	Py_RETURN_NONE;
}

static PyObject *Tx_enter(TxObject *self, PyObject *unused)
{
	return Py_NewRef(self);
}

/* Leaving the block: commit unless an exception is on its way out, which aborts. */
static PyObject *Tx_exit(TxObject *self, PyObject *args)
{
	PyObject *type = PyTuple_Size(args) > 0 ? PyTuple_GET_ITEM(args, 0) : Py_None, *r;

	if (self->over || !self->tx)
		Py_RETURN_FALSE;
	if (type != Py_None) {
		td_exc_state saved = td_exc_save();

		r = Tx_abort(self, NULL);
		Py_XDECREF(r);
		if (!r)
			PyErr_Clear(); /* the block's own exception is the one to see */
		td_exc_restore(saved);
		Py_RETURN_FALSE;
	}
	r = Tx_commit(self, NULL);
	if (!r)
		return NULL;
	Py_DECREF(r);
	Py_RETURN_FALSE;
}

static PyObject *Tx_get_commit_id(TxObject *self, void *unused)
{
	return Py_NewRef(self->commit_id);
}

static void Tx_dealloc(TxObject *self)
{
	if (self->tx) {
		tensord_tx *tx = self->tx;

		self->tx = NULL;
		/* Aborts what is still open; the daemon would at the connection's end. */
		Py_BEGIN_ALLOW_THREADS tensord_tx_free(tx);
		Py_END_ALLOW_THREADS
	}
	Py_XDECREF(self->commit_id);
	Py_XDECREF(self->client);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Tx_methods[] = {
	{ "put", (PyCFunction)(void (*)(void))Tx_put, METH_VARARGS | METH_KEYWORDS,
	  "put($self, /, name, obj, mutable=False, lifetime='persistent', mode=None, *, "
	  "replace=False)\n--\n\n"
	  "Stages a put, as Client.put(); published by the commit." },
	{ "create", (PyCFunction)(void (*)(void))Tx_create, METH_VARARGS | METH_KEYWORDS,
	  "create($self, /, name, shape, dtype, device='cpu', mutable=False, "
	  "lifetime='persistent', mode=None, strides=None, *, replace=False)\n--\n\n"
	  "Stages a create, as Client.create(): fill the Tensor, the commit publishes it." },
	{ "unlink", (PyCFunction)Tx_unlink, METH_VARARGS,
	  "unlink($self, name, /)\n--\n\nStages the unlink of a published name." },
	{ "commit", (PyCFunction)Tx_commit, METH_NOARGS,
	  "commit($self, /)\n--\n\n"
	  "Publishes every member and unlinks every staged name in one daemon step; returns\n"
	  "the commit id (0 when nothing was staged). On failure nothing is visible." },
	{ "abort", (PyCFunction)Tx_abort, METH_NOARGS,
	  "abort($self, /)\n--\n\nDiscards every member and staged unlink." },
	{ "__enter__", (PyCFunction)Tx_enter, METH_NOARGS,
	  "__enter__($self, /)\n--\n\nReturns self." },
	{ "__exit__", (PyCFunction)Tx_exit, METH_VARARGS,
	  "__exit__($self, /, *exc_info)\n--\n\nCommits, or aborts when an exception leaves "
	  "the block." },
	{ NULL },
};

static PyGetSetDef Tx_getset[] = {
	{ "commit_id", (getter)Tx_get_commit_id, NULL, "The commit id, once committed; else None.",
	  NULL },
	{ NULL },
};

static PyTypeObject td_TxType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tensord.Transaction",
	.tp_basicsize = sizeof(TxObject),
	.tp_dealloc = (destructor)Tx_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Creates, puts and unlinks made visible together by commit(), in one daemon\n"
		  "step, or not at all. A context manager: leaving the block commits, an\n"
		  "exception aborts.",
	.tp_methods = Tx_methods,
	.tp_getset = Tx_getset,
};

PyObject *td_client_transaction(ClientObject *self, PyObject *unused)
{
	tensord_client *c = td_client_enter(self);
	TxObject *tx;
	int rc;

	if (!c)
		return NULL;
	tx = PyObject_New(TxObject, &td_TxType);
	if (!tx) {
		td_client_leave(self, 0);
		return NULL;
	}
	tx->client = (ClientObject *)Py_NewRef(self);
	tx->commit_id = Py_NewRef(Py_None);
	tx->over = false;
	tx->tx = NULL;
	rc = tensord_tx_begin(c, &tx->tx);
	if (td_client_leave(self, rc) < 0) {
		Py_DECREF(tx);
		return NULL;
	}
	return (PyObject *)tx;
}

/* --- put_many ---------------------------------------------------------------------- */

PyObject *td_client_put_many(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "mapping", "mutable", "lifetime", "mode", "replace", NULL };
	PyObject *mapping, *mutable_o = NULL, *lifetime_o = NULL, *mode_o = NULL, *items = NULL;
	struct td_source *src = NULL;
	tensord_put_item *v = NULL;
	uint64_t commit = 0;
	Py_ssize_t n = 0, i = 0;
	uint32_t flags, mode;
	int rc = -1, replace = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$OOOp:put_many", kwlist, &mapping,
					 &mutable_o, &lifetime_o, &mode_o, &replace) ||
	    td_parse_flags(mutable_o, lifetime_o, mode_o, &flags, &mode) < 0)
		return NULL;
	if (replace)
		flags |= TENSORD_REPLACE;
	items = PyMapping_Items(mapping);
	if (!items)
		return NULL;
	n = PyList_GET_SIZE(items);
	src = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*src));
	v = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*v));
	if (!src || !v) {
		PyErr_NoMemory();
		goto out;
	}
	for (; i < n; i++) {
		PyObject *kv = PyList_GET_ITEM(items, i), *key = PyTuple_GET_ITEM(kv, 0);

		if (!PyUnicode_Check(key)) {
			PyErr_Format(PyExc_TypeError, "put_many() names must be str, not %.100s",
				     Py_TYPE(key)->tp_name);
			goto out;
		}
		v[i].name = PyUnicode_AsUTF8(key);
		if (!v[i].name || td_source_from(&src[i], PyTuple_GET_ITEM(kv, 1)) < 0) {
			i++; /* its source holds what it took */
			goto out;
		}
		v[i].src = &src[i].dl;
	}
	if (!td_client_enter(self))
		goto out;
	{
		tensord_client *c = self->c;

		Py_BEGIN_ALLOW_THREADS rc = tensord_put_many(c, v, (size_t)n, flags, mode, &commit);
		Py_END_ALLOW_THREADS
	}
	rc = td_put_leave(self, rc);
out:
	for (Py_ssize_t j = 0; src && j < i; j++)
		td_source_release(&src[j]);
	PyMem_Free(src);
	PyMem_Free(v);
	Py_DECREF(items);
	if (rc < 0)
		return NULL;
	return PyLong_FromUnsignedLongLong(commit);
}

/* --- attach_many ------------------------------------------------------------------- */

/*
 * The names of a list (any iterable but a str), checked and held in *ret
 * (n of them; the strings borrowed from *ret_keep, a new list). A str is a
 * prefix: *ret NULL. 0 or -1 with an exception.
 */
static int set_names(PyObject *what, const char ***ret, size_t *ret_n, PyObject **ret_keep)
{
	PyObject *list;
	const char **v;
	Py_ssize_t n;

	*ret = NULL;
	*ret_n = 0;
	*ret_keep = NULL;
	if (PyUnicode_Check(what))
		return 0;
	list = PySequence_List(what);
	if (!list)
		return -1;
	n = PyList_GET_SIZE(list);
	v = PyMem_Calloc(n ? (size_t)n : 1, sizeof(*v));
	if (!v) {
		Py_DECREF(list);
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *s = PyList_GET_ITEM(list, i);

		if (!PyUnicode_Check(s)) {
			PyErr_Format(PyExc_TypeError, "attach_many() names must be str, not %.100s",
				     Py_TYPE(s)->tp_name);
			goto fail;
		}
		if (!(v[i] = PyUnicode_AsUTF8(s)))
			goto fail;
	}
	*ret = v;
	*ret_n = (size_t)n;
	*ret_keep = list;
	return 0;
fail:
	PyMem_Free(v);
	Py_DECREF(list);
	return -1;
}

/* A dict name -> Tensor from set (consumed: every tensor taken, set freed). */
static PyObject *set_dict(tensord_set *set, ClientObject *client)
{
	PyObject *d = PyDict_New();

	for (size_t i = 0; i < set->n; i++) {
		PyObject *t;

		if (!d)
			break;
		t = td_tensor_new(set->tensors[i], client);
		set->tensors[i] = NULL; /* the Tensor's, even when it could not be made */
		if (!t || PyDict_SetItemString(d, set->names[i], t) < 0)
			Py_CLEAR(d);
		Py_XDECREF(t);
	}
	Py_BEGIN_ALLOW_THREADS tensord_set_free(set);
	Py_END_ALLOW_THREADS return d;
}

/* How long one wait lasts before Python's signal handlers get a turn (as attach). */
#define SET_SLICE_MS 100

PyObject *td_client_attach_many(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "names_or_prefix", "after", "timeout", NULL };
	PyObject *what, *after_o = Py_None, *timeout = Py_None, *keep = NULL;
	const char **names = NULL, *prefix = NULL;
	tensord_set *set = NULL;
	tensord_client *c;
	size_t n = 0;
	uint64_t after;
	double deadline;
	int ms, rc;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$OO:attach_many", kwlist, &what, &after_o,
					 &timeout) ||
	    td_parse_wait(timeout, after_o, &ms, &after) < 0 ||
	    set_names(what, &names, &n, &keep) < 0)
		return NULL;
	if (!names && !(prefix = PyUnicode_AsUTF8(what)))
		goto fail;
	if (!(c = td_client_enter(self)))
		goto fail;
	deadline = td_now_ms() + ms;
	for (;;) {
		int slice = ms;

		if (ms < 0 || ms > SET_SLICE_MS) {
			double left = deadline - td_now_ms();

			slice = ms < 0 || left > SET_SLICE_MS ? SET_SLICE_MS
							      : (left > 1 ? (int)left : 1);
		}
		Py_BEGIN_ALLOW_THREADS rc =
			tensord_attach_many(c, names, n, prefix, after, slice, &set);
		Py_END_ALLOW_THREADS if (rc != -ETIMEDOUT || slice == ms ||
					 (ms >= 0 && td_now_ms() >= deadline)) break;
		if (PyErr_CheckSignals() < 0) {
			td_client_leave(self, 0);
			goto fail;
		}
	}
	PyMem_Free(names);
	Py_XDECREF(keep);
	if (td_client_leave(self, rc) < 0)
		return NULL;
	return set_dict(set, self);
fail:
	PyMem_Free(names);
	Py_XDECREF(keep);
	return NULL;
}

/* --- Watch ------------------------------------------------------------------------- */

typedef struct {
	PyObject_HEAD ClientObject *client; /* strong */
	tensord_watch *w;                   /* owned; NULL once closed */
} WatchObject;

static PyTypeObject td_WatchType;

/* The next event, waiting up to ms (-1: forever; 0: None at once when there is none). */
static PyObject *watch_next(WatchObject *self, int ms)
{
	double deadline = td_now_ms() + ms;
	tensord_event ev;
	int rc;

	if (!self->w)
		return PyErr_Format(PyExc_ValueError, "the watch is closed");
	for (;;) {
		int slice = ms;

		if (ms < 0 || ms > SET_SLICE_MS) {
			double left = deadline - td_now_ms();

			slice = ms < 0 || left > SET_SLICE_MS ? SET_SLICE_MS
							      : (left > 1 ? (int)left : 1);
		}
		Py_BEGIN_ALLOW_THREADS rc = tensord_watch_next(self->w, slice, &ev);
		Py_END_ALLOW_THREADS if (rc == 0) return event_new(&ev);
		if (rc == -EAGAIN && ms == 0)
			Py_RETURN_NONE;
		if (rc != -ETIMEDOUT && rc != -EAGAIN)
			return td_raise(rc);
		if (ms >= 0 && td_now_ms() >= deadline)
			return td_raise(-ETIMEDOUT);
		if (PyErr_CheckSignals() < 0)
			return NULL;
	}
}

static PyObject *Watch_next(WatchObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "timeout", NULL };
	PyObject *timeout = Py_None;
	int ms;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:next", kwlist, &timeout))
		return NULL;
	if (timeout == Py_None)
		ms = -1;
	else if (td_parse_timeout(timeout, &ms) < 0)
		return NULL;
	return watch_next(self, ms);
}

static PyObject *Watch_iternext(WatchObject *self)
{
	if (!self->w)
		return NULL; /* closed: the iteration ends */
	return watch_next(self, -1);
}

static PyObject *Watch_poll(WatchObject *self, PyObject *unused)
{
	return watch_next(self, 0);
}

static PyObject *Watch_close(WatchObject *self, PyObject *unused)
{
	tensord_watch *w = self->w;

	self->w = NULL;
	if (w) {
		Py_BEGIN_ALLOW_THREADS tensord_watch_close(w);
		Py_END_ALLOW_THREADS
	}
	Py_RETURN_NONE;
}

static PyObject *Watch_enter(WatchObject *self, PyObject *unused)
{
	return Py_NewRef(self);
}

static PyObject *Watch_exit(WatchObject *self, PyObject *args)
{
	return Watch_close(self, NULL);
}

static void Watch_dealloc(WatchObject *self)
{
	PyObject *r = Watch_close(self, NULL);

	Py_XDECREF(r);
	Py_XDECREF(self->client);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Watch_methods[] = {
	{ "next", (PyCFunction)(void (*)(void))Watch_next, METH_VARARGS | METH_KEYWORDS,
	  "next($self, /, timeout=None)\n--\n\n"
	  "The next Event, waiting up to timeout seconds (None: as long as it takes;\n"
	  "TimeoutError after)." },
	{ "poll", (PyCFunction)Watch_poll, METH_NOARGS,
	  "poll($self, /)\n--\n\nThe next Event if one is there, else None (no wait)." },
	{ "close", (PyCFunction)Watch_close, METH_NOARGS,
	  "close($self, /)\n--\n\nEnds the watch." },
	{ "__enter__", (PyCFunction)Watch_enter, METH_NOARGS,
	  "__enter__($self, /)\n--\n\nReturns self." },
	{ "__exit__", (PyCFunction)Watch_exit, METH_VARARGS,
	  "__exit__($self, /, *exc_info)\n--\n\nCalls close()." },
	{ NULL },
};

static PyTypeObject td_WatchType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tensord.Watch",
	.tp_basicsize = sizeof(WatchObject),
	.tp_dealloc = (destructor)Watch_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Events for the names under a prefix, from Client.watch(): an iterator of\n"
		  "Event(kind, name, generation, commit), live from when watch() returned.",
	.tp_iter = PyObject_SelfIter,
	.tp_iternext = (iternextfunc)Watch_iternext,
	.tp_methods = Watch_methods,
};

PyObject *td_client_watch(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "prefix", "after", "queue", NULL };
	PyObject *after_o = Py_None;
	const char *prefix = "";
	unsigned int queue = 0;
	WatchObject *w;
	tensord_client *c;
	uint64_t after;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|s$OI:watch", kwlist, &prefix, &after_o,
					 &queue) ||
	    td_parse_after(after_o, &after) < 0 || !(c = td_client_enter(self)))
		return NULL;
	w = PyObject_New(WatchObject, &td_WatchType);
	if (!w) {
		td_client_leave(self, 0);
		return NULL;
	}
	w->client = (ClientObject *)Py_NewRef(self);
	w->w = NULL;
	Py_BEGIN_ALLOW_THREADS rc =
		tensord_watch_start(c, prefix, after_o != Py_None, after, queue, &w->w);
	Py_END_ALLOW_THREADS if (td_client_leave(self, rc) < 0)
	{
		Py_DECREF(w);
		return NULL;
	}
	return (PyObject *)w;
}

/* --- operations for tensord.aio -------------------------------------------------------- */

typedef struct {
	PyObject_HEAD ClientObject *client; /* strong */
	tensord_op *op;                     /* owned; NULL once finished */
	bool many;
} OpObject;

static PyTypeObject td_OpType;

static PyObject *Op_get_done(OpObject *self, void *unused)
{
	return PyBool_FromLong(!self->op || tensord_op_done(self->op));
}

static PyObject *Op_cancel(OpObject *self, PyObject *unused)
{
	int rc = self->op ? tensord_op_cancel(self->op) : 0;

	if (rc < 0)
		return td_raise(rc);
	Py_RETURN_NONE;
}

/* The answer: a Tensor, or the dict of a set; raises as the blocking call would. */
static PyObject *Op_result(OpObject *self, PyObject *unused)
{
	DLManagedTensorVersioned *mt = NULL;
	tensord_set *set = NULL;
	tensord_op *op = self->op;
	int rc;

	if (!op)
		return PyErr_Format(PyExc_ValueError, "the operation's result was taken");
	if (!tensord_op_done(op))
		return PyErr_Format(PyExc_ValueError, "the operation is not done");
	self->op = NULL;
	if (self->many)
		rc = tensord_attach_many_finish(op, &set);
	else
		rc = tensord_attach_finish(op, &mt);
	if (rc < 0)
		return td_raise(rc);
	return self->many ? set_dict(set, self->client) : td_tensor_new(mt, self->client);
}

static void Op_dealloc(OpObject *self)
{
	if (self->op)
		tensord_op_free(self->op); /* cancels a wait still parked */
	Py_XDECREF(self->client);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Op_methods[] = {
	{ "result", (PyCFunction)Op_result, METH_NOARGS, NULL },
	{ "cancel", (PyCFunction)Op_cancel, METH_NOARGS, NULL },
	{ NULL },
};

static PyGetSetDef Op_getset[] = {
	{ "done", (getter)Op_get_done, NULL, NULL, NULL },
	{ NULL },
};

static PyTypeObject td_OpType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tensord._Op",
	.tp_basicsize = sizeof(OpObject),
	.tp_dealloc = (destructor)Op_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "An attach or attach_many started without waiting (for tensord.aio).",
	.tp_methods = Op_methods,
	.tp_getset = Op_getset,
};

static PyObject *op_wrap(ClientObject *self, tensord_op *op, bool many)
{
	OpObject *o = PyObject_New(OpObject, &td_OpType);

	if (!o) {
		tensord_op_free(op);
		return NULL;
	}
	o->client = (ClientObject *)Py_NewRef(self);
	o->op = op;
	o->many = many;
	return (PyObject *)o;
}

/* A timeout in seconds (None: forever, as a wait in tensord.aio) to milliseconds. */
static int aio_timeout(PyObject *timeout, int *ms)
{
	if (timeout == Py_None) {
		*ms = -1;
		return 0;
	}
	return td_parse_timeout(timeout, ms);
}

PyObject *td_client_attach_start(ClientObject *self, PyObject *args)
{
	PyObject *after_o, *timeout;
	tensord_client *c;
	const char *name;
	tensord_op *op;
	uint64_t after;
	int ms, rc;

	if (!PyArg_ParseTuple(args, "sOO:_attach_start", &name, &after_o, &timeout) ||
	    td_parse_after(after_o, &after) < 0 || aio_timeout(timeout, &ms) < 0 ||
	    !(c = td_client_enter(self)))
		return NULL;
	rc = tensord_attach_start(c, name, after, ms, &op);
	if (td_client_leave(self, rc) < 0)
		return NULL;
	return op_wrap(self, op, false);
}

PyObject *td_client_attach_many_start(ClientObject *self, PyObject *args)
{
	PyObject *what, *after_o, *timeout, *keep = NULL, *r = NULL;
	const char **names = NULL, *prefix = NULL;
	tensord_client *c;
	tensord_op *op;
	size_t n = 0;
	uint64_t after;
	int ms, rc;

	if (!PyArg_ParseTuple(args, "OOO:_attach_many_start", &what, &after_o, &timeout) ||
	    td_parse_after(after_o, &after) < 0 || aio_timeout(timeout, &ms) < 0 ||
	    set_names(what, &names, &n, &keep) < 0)
		return NULL;
	if ((names || (prefix = PyUnicode_AsUTF8(what))) && (c = td_client_enter(self))) {
		rc = tensord_attach_many_start(c, names, n, prefix, after, ms, &op);
		if (td_client_leave(self, rc) == 0)
			r = op_wrap(self, op, true);
	}
	PyMem_Free(names);
	Py_XDECREF(keep);
	return r;
}

PyObject *td_client_poll(ClientObject *self, PyObject *unused)
{
	tensord_client *c = td_client_enter(self);
	int rc;

	if (!c)
		return NULL;
	/* Never blocks: the GIL stays. */
	rc = tensord_poll(c);
	if (td_client_leave(self, rc < 0 ? rc : 0) < 0)
		return NULL;
	return PyLong_FromLong(rc);
}

PyObject *td_client_fileno(ClientObject *self, PyObject *unused)
{
	tensord_client *c = td_client_enter(self);
	int fd;

	if (!c)
		return NULL;
	fd = tensord_fd(c);
	if (td_client_leave(self, fd < 0 ? fd : 0) < 0)
		return NULL;
	return PyLong_FromLong(fd);
}

int td_sets_types_ready(PyObject *mod)
{
	if (!td_EventType.tp_name && PyStructSequence_InitType2(&td_EventType, &event_desc) < 0)
		return -1;
	if (PyType_Ready(&td_TxType) < 0 || PyType_Ready(&td_WatchType) < 0 ||
	    PyType_Ready(&td_OpType) < 0)
		return -1;
	if (PyModule_AddObjectRef(mod, "Event", (PyObject *)&td_EventType) < 0 ||
	    PyModule_AddObjectRef(mod, "Transaction", (PyObject *)&td_TxType) < 0 ||
	    PyModule_AddObjectRef(mod, "Watch", (PyObject *)&td_WatchType) < 0)
		return -1;
	return 0;
}
