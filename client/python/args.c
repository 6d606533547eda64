/*
 * Python arguments to libtensord values: dtypes, devices, shapes and
 * strides, timeouts, the mutable/lifetime/mode trio that create() and
 * put() share, and create()'s arguments (Client's and Transaction's). Each parser returns 0 (or a count) on success and -1 with an
 * exception set; none of them calls libtensord beyond its pure name parsers.
 */
#include "tdpy.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

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
			PyErr_Format(PyExc_ValueError,
				     "mode must be permission bits 0..0o7777, not %ld", v);
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
 * numpy's reading of o (np.float32, np.dtype("f4"), "<f4", "float", ...) as
 * one of our names, when numpy is importable. 1 with *ret set, 0 when numpy
 * does not know o either (no exception left), -1 with an exception.
 */
static int dtype_from_numpy(PyObject *o, DLDataType *ret)
{
	PyObject *np = PyImport_ImportModule("numpy"), *dt = NULL, *name = NULL, *order = NULL;
	const char *txt, *bo;
	int rc = 0;

	if (!np) {
		PyErr_Clear();
		return 0;
	}
	dt = PyObject_CallMethod(np, "dtype", "O", o);
	if (!dt) {
		PyErr_Clear();
		goto out;
	}
	name = PyObject_GetAttrString(dt, "name");
	order = PyObject_GetAttrString(dt, "byteorder");
	if (!name || !order || !(txt = PyUnicode_AsUTF8(name)) || !(bo = PyUnicode_AsUTF8(order))) {
		rc = -1;
		goto out;
	}
	if (bo[0] == '>') {
		PyErr_Format(PyExc_ValueError,
			     "dtype %R is big-endian; tensors are little-endian "
			     "(convert with .astype('%s'))",
			     o, txt);
		rc = -1;
		goto out;
	}
	if (tensord_dtype_parse(txt, ret) == 0)
		rc = 1;
out:
	Py_XDECREF(order);
	Py_XDECREF(name);
	Py_XDECREF(dt);
	Py_DECREF(np);
	return rc;
}

/*
 * A dtype as users write it: our names ("float32", "bfloat16"), torch
 * dtypes (torch.float16), and anything numpy.dtype() accepts (np.float32,
 * "f4", "<f4", "float" meaning float64 as in numpy).
 */
int td_parse_dtype(PyObject *o, DLDataType *ret)
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
	/* The C library's C spellings ("half", "float", "double") yield to
	 * numpy's meaning in Python: "float" is float64 there. */
	rc = strcmp(txt, "half") && strcmp(txt, "float") && strcmp(txt, "double")
		     ? tensord_dtype_parse(txt, ret)
		     : -1;
	if (rc < 0) {
		int n = dtype_from_numpy(o, ret);

		if (n < 0) {
			Py_DECREF(s);
			return -1;
		}
		rc = n ? 0 : tensord_dtype_parse(txt, ret);
	}
	if (rc < 0)
		PyErr_Format(PyExc_ValueError,
			     "unknown dtype %R: use bool, int8..int64, uint8..uint64, float16, "
			     "bfloat16, float32, float64, complex64, complex128, float8_e4m3fn, "
			     "float8_e5m2 (and the other float8/float6/float4 names of torch and "
			     "ml_dtypes), or a numpy or torch dtype",
			     o);
	Py_DECREF(s);
	return rc < 0 ? -1 : 0;
}

/* DLPack numbers its device types from 1 (kDLCPU); they are far below this. */
#define DEVICE_TYPES_MAX 64

/*
 * "'cpu', 'cuda:N' or 'rocm:N'": the devices tensord_device_parse() takes,
 * named as the library names them: the host, then each device type it
 * serves as a GPU. Returns buf.
 */
static const char *device_choices(char *buf, size_t len)
{
	char names[DEVICE_TYPES_MAX][32];
	size_t off = 0;
	int n = 0;

	snprintf(names[n++], sizeof(names[0]), "cpu");
	for (int t = kDLCPU + 1; t < DEVICE_TYPES_MAX; t++) {
		char *colon;

		if (!tensord_device_is_gpu((DLDeviceType)t))
			continue;
		tensord_device_name((DLDevice){ (DLDeviceType)t, 0 }, names[n], sizeof(names[0]));
		colon = strchr(names[n], ':');
		if (colon)
			snprintf(colon, sizeof(names[0]) - (size_t)(colon - names[n]), ":N");
		n++;
	}
	buf[0] = '\0';
	for (int i = 0; i < n && off < len; i++)
		off += (size_t)snprintf(buf + off, len - off, "%s'%s'",
					i == 0       ? ""
					: i == n - 1 ? " or "
						     : ", ",
					names[i]);
	return buf;
}

int td_parse_device(PyObject *o, DLDevice *ret)
{
	PyObject *s = PyUnicode_Check(o) ? Py_NewRef(o) : PyObject_Str(o);
	const char *txt = s ? PyUnicode_AsUTF8(s) : NULL;
	int rc = txt ? tensord_device_parse(txt, ret) : -1;
	char choices[256];

	if (txt && rc < 0)
		PyErr_Format(PyExc_ValueError, "unknown device %R: use %s", o,
			     device_choices(choices, sizeof(choices)));
	Py_XDECREF(s);
	return rc < 0 ? -1 : 0;
}

int td_parse_dims(PyObject *o, const char *what, int64_t *out)
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
		PyErr_Format(PyExc_ValueError, "%s has %zd dimensions; at most %d are allowed",
			     what, n, TENSORD_NDIM_MAX);
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

int td_parse_timeout(PyObject *o, int *ms)
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
		PyErr_SetString(PyExc_ValueError,
				"timeout must be None or a number of seconds >= 0");
		return -1;
	}
	*ms = s * 1000.0 >= (double)INT_MAX ? -1 : (int)ceil(s * 1000.0);
	return 0;
}

int td_parse_device_pair(PyObject *o, const char *what, DLDevice *ret)
{
	long type, id;

	if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2) {
		PyErr_Format(PyExc_TypeError, "%s must be a 2-tuple of ints, not %R", what, o);
		return -1;
	}
	type = PyLong_AsLong(PyTuple_GET_ITEM(o, 0));
	id = (type == -1 && PyErr_Occurred()) ? -1 : PyLong_AsLong(PyTuple_GET_ITEM(o, 1));
	if (PyErr_Occurred())
		return -1;
	ret->device_type = (DLDeviceType)type;
	ret->device_id = (int32_t)id;
	return 0;
}

int td_parse_create(PyObject *args, PyObject *kwds, struct td_create_args *a)
{
	static char *kwlist[] = { "name", "shape",   "dtype",   "device",  "mutable", "lifetime",
				  "mode", "strides", "replace", "recycle", NULL };
	PyObject *shape_o, *dtype_o, *device_o = NULL, *mutable_o = NULL, *lifetime_o = NULL,
				     *mode_o = NULL, *strides_o = Py_None;
	int replace = 0, recycle = 0;

	a->spec = (tensord_spec){ .device = { kDLCPU, 0 } };
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "sOO|OOOOO$pp:create", kwlist, &a->name,
					 &shape_o, &dtype_o, &device_o, &mutable_o, &lifetime_o,
					 &mode_o, &strides_o, &replace, &recycle))
		return -1;
	if ((a->spec.ndim = td_parse_dims(shape_o, "shape", a->shape)) < 0 ||
	    td_parse_dtype(dtype_o, &a->spec.dtype) < 0 ||
	    (device_o && td_parse_device(device_o, &a->spec.device) < 0) ||
	    td_parse_flags(mutable_o, lifetime_o, mode_o, &a->spec.flags, &a->spec.mode) < 0)
		return -1;
	a->spec.shape = a->spec.ndim ? a->shape : NULL;
	if (replace)
		a->spec.flags |= TENSORD_REPLACE;
	if (recycle)
		a->spec.flags |= TENSORD_RECYCLE;
	if (strides_o != Py_None) {
		int n = td_parse_dims(strides_o, "strides", a->strides);

		if (n < 0)
			return -1;
		if (n != a->spec.ndim) {
			PyErr_Format(PyExc_ValueError, "strides has %d entries but shape has %d", n,
				     a->spec.ndim);
			return -1;
		}
		a->spec.strides = a->spec.ndim ? a->strides : NULL;
	}
	return 0;
}
