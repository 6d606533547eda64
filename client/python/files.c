/*
 * Checkpoint files for Python (docs/python.md, "Checkpoint files"):
 * Client.put_file() and Client.get_file(), libtensord's tensord_put_file()
 * and tensord_get_file() with the GIL released.
 */
#include "tdpy.h"

#include <errno.h>

PyObject *td_client_put_file(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {
		"prefix", "path", "replace", "mutable", "lifetime", "mode", NULL
	};
	PyObject *path_o = NULL, *mutable_o = NULL, *lifetime_o = NULL, *mode_o = NULL;
	tensord_file_options o = { 0 };
	const char *prefix;
	uint64_t commit = 0;
	tensord_client *c;
	int rc, replace = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "sO&|$pOOO:put_file", kwlist, &prefix,
					 PyUnicode_FSConverter, &path_o, &replace, &mutable_o,
					 &lifetime_o, &mode_o))
		return NULL;
	if (td_parse_flags(mutable_o, lifetime_o, mode_o, &o.flags, &o.mode) < 0 ||
	    !(c = td_client_enter(self))) {
		Py_DECREF(path_o);
		return NULL;
	}
	if (replace)
		o.flags |= TENSORD_REPLACE;
	{
		const char *path = PyBytes_AS_STRING(path_o);

		Py_BEGIN_ALLOW_THREADS rc =
			tensord_put_file(c, prefix, path, &o, &commit, NULL, NULL);
		Py_END_ALLOW_THREADS
	}
	Py_DECREF(path_o);
	if (td_client_leave(self, rc) < 0)
		return NULL;
	return PyLong_FromUnsignedLongLong(commit);
}

PyObject *td_client_get_file(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "prefix_or_names", "path", NULL };
	PyObject *what, *path_o = NULL, *keep = NULL;
	const char **names = NULL, *prefix = NULL;
	uint64_t commit = 0;
	tensord_client *c;
	size_t n = 0;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO&:get_file", kwlist, &what,
					 PyUnicode_FSConverter, &path_o))
		return NULL;
	if (td_set_names(what, &names, &n, &keep) < 0)
		goto fail;
	if (!names && !(prefix = PyUnicode_AsUTF8(what)))
		goto fail;
	if (!(c = td_client_enter(self)))
		goto fail;
	{
		const char *path = PyBytes_AS_STRING(path_o);

		Py_BEGIN_ALLOW_THREADS rc =
			tensord_get_file(c, names, n, prefix, path, NULL, &commit, NULL);
		Py_END_ALLOW_THREADS
	}
	PyMem_Free(names);
	Py_XDECREF(keep);
	Py_DECREF(path_o);
	if (td_client_leave(self, rc) < 0)
		return NULL;
	return PyLong_FromUnsignedLongLong(commit);
fail:
	PyMem_Free(names);
	Py_XDECREF(keep);
	Py_XDECREF(path_o);
	return NULL;
}
