/*
 * The operations tensord.aio drives from an event loop (docs/python.md):
 * Client._attach_start(), _attach_many_start(), _poll(), _restart_state(),
 * _reconnect() and fileno(), and the _Op type whose result() ends one. Each libtensord call runs with the
 * GIL released, between td_client_enter() and td_client_leave().
 */
#include "tdpy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
	return self->many ? td_set_dict(set, self->client) : td_tensor_new(mt, self->client);
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
	    td_set_names(what, &names, &n, &keep) < 0)
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

/*
 * tensord_fd() with the GIL released: the connection serving now, a new
 * one when it was lost, for tensord.aio to make on a worker thread
 * (connecting waits for the daemon's Hello). None, or raises.
 */
PyObject *td_client_reconnect(ClientObject *self, PyObject *unused)
{
	tensord_client *c = td_client_enter(self);
	int fd;

	if (!c)
		return NULL;
	Py_BEGIN_ALLOW_THREADS fd = tensord_fd(c);
	Py_END_ALLOW_THREADS if (td_client_leave(self, fd < 0 ? fd : 0) < 0) return NULL;
	Py_RETURN_NONE;
}

/*
 * (epoch, lineage, lost): tensord_epoch(), tensord_lineage() and
 * tensord_lost() of the client, for tensord.aio's waits across a restart
 * (docs/restart.md, "Clients carry on"). No request.
 */
PyObject *td_client_restart_state(ClientObject *self, PyObject *unused)
{
	tensord_client *c = td_client_enter(self);
	unsigned epoch;
	uint64_t lineage;
	bool lost;

	if (!c)
		return NULL;
	epoch = tensord_epoch(c);
	lineage = tensord_lineage(c);
	lost = tensord_lost(c);
	if (td_client_leave(self, 0) < 0)
		return NULL;
	return Py_BuildValue("(IKO)", epoch, (unsigned long long)lineage,
			     lost ? Py_True : Py_False);
}

int td_aio_types_ready(void)
{
	return PyType_Ready(&td_OpType);
}
