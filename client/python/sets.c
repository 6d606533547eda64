/*
 * Sets for Python (docs/python.md): Client.transaction() and the
 * Transaction type, Client.put_many() (one transaction of puts) and
 * Client.attach_many(). Each libtensord call that talks to the daemon runs
 * with the GIL released, between td_client_enter() and td_client_leave().
 * Watches are watch.c's, the operations tensord.aio drives aio.c's.
 */
#include "tdpy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
	static char *kwlist[] = { "name", "obj",     "mutable", "lifetime",
				  "mode", "replace", "sealed",  NULL };
	PyObject *obj, *mutable_o = NULL, *lifetime_o = NULL, *mode_o = NULL;
	struct td_source s = { 0 };
	const char *name;
	uint32_t flags, mode;
	int rc, replace = 0, sealed = 0;

	if (tx_open(self) < 0 ||
	    !PyArg_ParseTupleAndKeywords(args, kwds, "sO|OOO$pp:put", kwlist, &name, &obj,
					 &mutable_o, &lifetime_o, &mode_o, &replace, &sealed) ||
	    td_parse_flags(mutable_o, lifetime_o, mode_o, &flags, &mode) < 0)
		return NULL;
	if (replace)
		flags |= TENSORD_REPLACE;
	if (sealed)
		flags |= TENSORD_SEALED;
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
	struct td_create_args a;
	DLManagedTensorVersioned *mt = NULL;
	int rc;

	if (tx_open(self) < 0 || td_parse_create(args, kwds, &a) < 0)
		return NULL;
	if (!td_client_enter(self->client))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = tensord_tx_create(self->tx, a.name, &a.spec, &mt);
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
	  "replace=False, sealed=False)\n--\n\n"
	  "Stages a put, as Client.put(); published by the commit." },
	{ "create", (PyCFunction)(void (*)(void))Tx_create, METH_VARARGS | METH_KEYWORDS,
	  "create($self, /, name, shape, dtype, device='cpu', mutable=False, "
	  "lifetime='persistent', mode=None, strides=None, *, replace=False, recycle=False)\n--\n\n"
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
	static char *kwlist[] = { "mapping", "mutable", "lifetime", "mode",
				  "replace", "sealed",  NULL };
	PyObject *mapping, *mutable_o = NULL, *lifetime_o = NULL, *mode_o = NULL, *items = NULL;
	struct td_source *src = NULL;
	tensord_put_item *v = NULL;
	uint64_t commit = 0;
	Py_ssize_t n = 0, i = 0;
	uint32_t flags, mode;
	int rc = -1, replace = 0, sealed = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$OOOpp:put_many", kwlist, &mapping,
					 &mutable_o, &lifetime_o, &mode_o, &replace, &sealed) ||
	    td_parse_flags(mutable_o, lifetime_o, mode_o, &flags, &mode) < 0)
		return NULL;
	if (replace)
		flags |= TENSORD_REPLACE;
	if (sealed)
		flags |= TENSORD_SEALED;
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

int td_set_names(PyObject *what, const char ***ret, size_t *ret_n, PyObject **ret_keep)
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

PyObject *td_set_dict(tensord_set *set, ClientObject *client)
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

PyObject *td_client_attach_many(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "names_or_prefix", "after", "timeout", NULL };
	PyObject *what, *after_o = Py_None, *timeout = Py_None, *keep = NULL;
	const char **names = NULL, *prefix = NULL;
	tensord_set *set = NULL;
	tensord_client *c;
	size_t n = 0;
	uint64_t after;
	double deadline, lost_since = 0;
	unsigned epoch;
	uint64_t lineage;
	int ms, rc;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|$OO:attach_many", kwlist, &what, &after_o,
					 &timeout) ||
	    td_parse_wait(timeout, after_o, &ms, &after) < 0 ||
	    td_set_names(what, &names, &n, &keep) < 0)
		return NULL;
	if (!names && !(prefix = PyUnicode_AsUTF8(what)))
		goto fail;
	if (!(c = td_client_enter(self)))
		goto fail;
	deadline = td_now_ms() + ms;
	epoch = tensord_epoch(c);
	lineage = tensord_lineage(c);
	for (;;) {
		int slice = td_wait_slice(ms, deadline);
		unsigned seen = tensord_epoch(c);

		/* The daemon restarted empty since the wait began: after was the old one's. */
		if (seen != epoch && tensord_lineage(c) != lineage)
			after = 0;
		Py_BEGIN_ALLOW_THREADS rc =
			tensord_attach_many(c, names, n, prefix, after, slice, &set);
		Py_END_ALLOW_THREADS if (rc == 0 || slice == ms ||
					 !td_wait_goes_on(c, rc, seen, ms, deadline,
							  &lost_since)) break;
		if (PyErr_CheckSignals() < 0) {
			td_client_leave(self, 0);
			goto fail;
		}
	}
	PyMem_Free(names);
	Py_XDECREF(keep);
	if (td_client_leave(self, rc) < 0)
		return NULL;
	return td_set_dict(set, self);
fail:
	PyMem_Free(names);
	Py_XDECREF(keep);
	return NULL;
}

int td_sets_types_ready(PyObject *mod)
{
	if (PyType_Ready(&td_TxType) < 0)
		return -1;
	return PyModule_AddObjectRef(mod, "Transaction", (PyObject *)&td_TxType) < 0 ? -1 : 0;
}
