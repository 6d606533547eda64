/*
 * tensord._tensord: the module itself, its functions (connect,
 * default_socket_path) and the tensord.Error hierarchy every other file
 * raises through td_raise(). Every libtensord call that talks to the daemon
 * runs with the GIL released; libtensord is thread-safe, so several Python
 * threads may share one Client.
 */
#include "tdpy.h"

#include <errno.h>
#include <pthread.h>

/* The tensord.Error hierarchy; set once at module init, never freed. */
static PyObject *Error, *NotFoundError, *ExistsError, *TimedOutError, *AccessDeniedError,
	*NoDaemonError, *ConnectionLostError;

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
	case ECONNRESET:
	case EPIPE:
	case ECONNABORTED:
		return raise_as(ConnectionLostError, rc);
	case ENOMEM:
		return PyErr_NoMemory();
	default:
		return raise_as(Error, rc);
	}
}

PyObject *td_raise_connect(int rc)
{
	return rc == -ENOENT || rc == -ENOTSOCK ? raise_as(NoDaemonError, rc) : td_raise(rc);
}

/* --- module functions ------------------------------------------------------ */

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

/* tensord_thread_role(): tensord.aio's inline writes never connect on the loop's thread. */
static PyObject *mod_thread_role(PyObject *mod, PyObject *arg)
{
	long r = PyLong_AsLong(arg);

	if (r == -1 && PyErr_Occurred())
		return NULL;
	if (r < TENSORD_THREAD_PLAIN || r > TENSORD_THREAD_LOOP_WORKER) {
		PyErr_Format(PyExc_ValueError, "_thread_role(): %ld is no role (0, 1 or 2)", r);
		return NULL;
	}
	tensord_thread_role((int)r);
	Py_RETURN_NONE;
}

static PyMethodDef mod_methods[] = {
	{ "connect", (PyCFunction)(void (*)(void))mod_connect, METH_VARARGS | METH_KEYWORDS,
	  "connect(path=None, *, name=None)\n--\n\n"
	  "Returns a Client connected to the tensord daemon at path, or, with None, at the\n"
	  "default socket path (see default_socket_path()) and then at\n"
	  "/run/tensord/tensord.sock. Before sending anything it checks that the socket, its\n"
	  "directory and the daemon (SO_PEERCRED) belong to you, root or $TENSORD_DAEMON_UID.\n"
	  "Raises ConnectionRefusedError (tensord.NoDaemonError) when no daemon listens there,\n"
	  "PermissionError (tensord.AccessDeniedError) with errno EACCES when the socket's mode\n"
	  "refuses you and EPERM when someone else owns or serves it.\n"
	  "name labels the connection (\"rollout-1\"; 1 to 63 bytes of printable ASCII without\n"
	  "spaces) for clients() and leases() and tensorctl's clients and leases; None takes\n"
	  "$TENSORD_CLIENT_NAME when set. One that is not valid raises tensord.Error (EINVAL)." },
	{ "_thread_role", mod_thread_role, METH_O,
	  "_thread_role($module, role, /)\n--\n\n"
	  "What the calling thread is to an event loop (tensord.aio's): 0 a plain thread, 1 the\n"
	  "loop's (a put, put_many or unlink made there that loses its connection raises\n"
	  "ConnectionLostError instead of reconnecting, and is kept), 2 the loop's worker (the\n"
	  "same call made again there asks the daemon whether the kept one took effect)." },
	{ "default_socket_path", mod_default_socket_path, METH_NOARGS,
	  "default_socket_path($module, /)\n--\n\n"
	  "Returns a str: the socket path connect() tries first when given None (and the one\n"
	  "tensord listens on when started by this user with no settings)." },
	{ NULL },
};

static struct PyModuleDef moddef = {
	PyModuleDef_HEAD_INIT,
	.m_name = "tensord._tensord",
	.m_doc = "The C part of the tensord Python client; import tensord instead.",
	.m_size = -1,
	.m_methods = mod_methods,
};

/* --- module init ------------------------------------------------------------ */

/* Returns a new reference to the class, which mod also holds; NULL on error. */
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

/*
 * Makes the error classes on the first import and adds them to mod; a
 * later import (after the module was dropped from sys.modules) reuses them.
 */
static int add_errors(PyObject *mod)
{
	if (Error) {
		if (PyModule_AddObjectRef(mod, "Error", Error) < 0 ||
		    PyModule_AddObjectRef(mod, "NotFoundError", NotFoundError) < 0 ||
		    PyModule_AddObjectRef(mod, "ExistsError", ExistsError) < 0 ||
		    PyModule_AddObjectRef(mod, "TimedOutError", TimedOutError) < 0 ||
		    PyModule_AddObjectRef(mod, "AccessDeniedError", AccessDeniedError) < 0 ||
		    PyModule_AddObjectRef(mod, "NoDaemonError", NoDaemonError) < 0 ||
		    PyModule_AddObjectRef(mod, "ConnectionLostError", ConnectionLostError) < 0)
			return -1;
		return 0;
	}
	Error = new_error(mod, "Error", NULL,
			  "Base of every tensord error; an OSError whose errno is the\n"
			  "daemon's code and whose message names the tensor and the reason.");
	if (!Error)
		return -1;
	NotFoundError = new_error(mod, "NotFoundError", PyExc_FileNotFoundError,
				  "No such tensor (ENOENT).");
	ExistsError =
		new_error(mod, "ExistsError", PyExc_FileExistsError, "The name is taken (EEXIST).");
	TimedOutError = new_error(mod, "TimedOutError", PyExc_TimeoutError,
				  "attach() waited its timeout out (ETIMEDOUT).");
	AccessDeniedError = new_error(mod, "AccessDeniedError", PyExc_PermissionError,
				      "Refused by the tensor's owner or mode (EPERM, EACCES).");
	NoDaemonError = new_error(mod, "NoDaemonError", PyExc_ConnectionRefusedError,
				  "No daemon listens on the socket (ECONNREFUSED, ENOENT).");
	ConnectionLostError =
		new_error(mod, "ConnectionLostError", PyExc_ConnectionResetError,
			  "The connection to the daemon was lost (it crashed or restarted) while\n"
			  "the request was in flight (ECONNRESET, EPIPE). The same client's next\n"
			  "request connects anew; waits go on across the restart.");
	if (!NotFoundError || !ExistsError || !TimedOutError || !AccessDeniedError ||
	    !NoDaemonError || !ConnectionLostError)
		return -1;
	return 0;
}

static void count_fork(void)
{
	td_py_forks++;
}

PyMODINIT_FUNC PyInit__tensord(void)
{
	PyObject *mod;
	static bool registered;

	if (!registered && pthread_atfork(NULL, NULL, count_fork) == 0)
		registered = true;

	if (td_info_type_ready() < 0 || td_inspect_types_ready() < 0 ||
	    PyType_Ready(&td_ClientType) < 0 || PyType_Ready(&td_TensorType) < 0 ||
	    td_exchange_api_publish() < 0)
		return NULL;

	if (!(mod = PyModule_Create(&moddef)))
		return NULL;
	if (PyModule_AddObjectRef(mod, "Client", (PyObject *)&td_ClientType) < 0 ||
	    PyModule_AddObjectRef(mod, "Tensor", (PyObject *)&td_TensorType) < 0 ||
	    PyModule_AddObjectRef(mod, "TensorInfo", (PyObject *)&td_InfoType) < 0 ||
	    PyModule_AddObjectRef(mod, "LeaseHolder", (PyObject *)&td_LeaseHolderType) < 0 ||
	    PyModule_AddObjectRef(mod, "ClientInfo", (PyObject *)&td_ClientInfoType) < 0 ||
	    PyModule_AddObjectRef(mod, "PeerInfo", (PyObject *)&td_PeerInfoType) < 0 ||
	    PyModule_AddIntConstant(mod, "DLPACK_MAJOR_VERSION", DLPACK_MAJOR_VERSION) < 0 ||
	    PyModule_AddIntConstant(mod, "DLPACK_MINOR_VERSION", DLPACK_MINOR_VERSION) < 0 ||
	    PyModule_AddIntConstant(mod, "PROTOCOL_VERSION", TENSORD_PROTOCOL_VERSION) < 0 ||
	    PyModule_AddStringConstant(mod, "__version__", TENSORD_VERSION) < 0 ||
	    add_errors(mod) < 0 || td_sets_types_ready(mod) < 0 || td_watch_types_ready(mod) < 0 ||
	    td_aio_types_ready() < 0) {
		Py_DECREF(mod);
		return NULL;
	}
	return mod;
}
