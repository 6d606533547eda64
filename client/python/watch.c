/*
 * Watches for Python (docs/python.md): Client.watch(), the Watch type (an
 * iterator of events, a context manager) and the Event records it yields.
 * Waiting for an event runs with the GIL released, between
 * td_client_enter() and td_client_leave().
 */
#include "tdpy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* --- Event ------------------------------------------------------------------------- */

static PyStructSequence_Field event_fields[] = {
	{ "kind", "'published', 'unlinked', 'lagged' (events were dropped or coalesced) or "
		  "'restarted' (the daemon restarted empty: commit ids before mean nothing now)" },
	{ "name", "the tensor's name ('' for lagged and restarted)" },
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
	static const char *const kinds[] = { "published", "unlinked", "lagged", "restarted" };
	PyObject *v[4];

	v[0] = PyUnicode_FromString(kinds[(unsigned)e->kind <= 3 ? e->kind : 2]);
	v[1] = PyUnicode_FromString(e->name);
	v[2] = PyLong_FromUnsignedLongLong(e->generation);
	v[3] = PyLong_FromUnsignedLongLong(e->commit);
	return td_record_new(&td_EventType, v, 4);
}

/* --- Watch ------------------------------------------------------------------------- */

typedef struct {
	PyObject_HEAD ClientObject *client; /* strong */
	tensord_watch *w;                   /* owned; NULL once closed */
} WatchObject;

static PyTypeObject td_WatchType;

/*
 * A lost connection of the watch replaced, as a call without a wait needs
 * in this blocking API (poll(), next(timeout=0)): tensord_watch_next(w, 0)
 * never connects, since an event loop's thread must not wait for a Hello
 * (tensord.aio connects on a worker thread and calls _poll()). A failure
 * is the watch's to report, past TENSORD_RECONNECT_MS.
 */
static void reconnect(WatchObject *self)
{
	tensord_client *c;

	if (tensord_watch_fd(self->w) >= 0)
		return;
	if (!(c = td_client_enter(self->client))) {
		PyErr_Clear(); /* closed: the watch says so */
		return;
	}
	Py_BEGIN_ALLOW_THREADS tensord_fd(c);
	Py_END_ALLOW_THREADS td_client_leave(self->client, 0);
}

/*
 * The next event, waiting up to ms (-1: forever; 0: None at once when
 * there is none); with ms 0 a lost connection is replaced first when
 * connect.
 */
static PyObject *watch_next(WatchObject *self, int ms, bool connect)
{
	double deadline = td_now_ms() + ms;
	tensord_event ev;
	int rc;

	if (!self->w)
		return PyErr_Format(PyExc_ValueError, "the watch is closed");
	if (ms == 0 && connect)
		reconnect(self);
	for (;;) {
		int slice = td_wait_slice(ms, deadline);

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
	return watch_next(self, ms, true);
}

static PyObject *Watch_iternext(WatchObject *self)
{
	if (!self->w)
		return NULL; /* closed: the iteration ends */
	return watch_next(self, -1, true);
}

static PyObject *Watch_poll(WatchObject *self, PyObject *unused)
{
	return watch_next(self, 0, true);
}

/* poll() for tensord.aio: never connects (the loop's thread must not wait). */
static PyObject *Watch_poll_nowait(WatchObject *self, PyObject *unused)
{
	return watch_next(self, 0, false);
}

/* tensord_watch_fd(): the descriptor to read before poll(); -1 while its connection is lost. */
static PyObject *Watch_fileno(WatchObject *self, PyObject *unused)
{
	if (!self->w)
		return PyErr_Format(PyExc_ValueError, "the watch is closed");
	int fd = tensord_watch_fd(self->w);

	return PyLong_FromLong(fd < 0 ? -1 : fd);
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
	{ "_fileno", (PyCFunction)Watch_fileno, METH_NOARGS, NULL },
	{ "_poll", (PyCFunction)Watch_poll_nowait, METH_NOARGS, NULL },
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

int td_watch_types_ready(PyObject *mod)
{
	if (!td_EventType.tp_name && PyStructSequence_InitType2(&td_EventType, &event_desc) < 0)
		return -1;
	if (PyType_Ready(&td_WatchType) < 0)
		return -1;
	if (PyModule_AddObjectRef(mod, "Event", (PyObject *)&td_EventType) < 0 ||
	    PyModule_AddObjectRef(mod, "Watch", (PyObject *)&td_WatchType) < 0)
		return -1;
	return 0;
}
