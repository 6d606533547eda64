/*
 * The tensord._tensord extension: shared declarations. module.c holds the
 * module, the errors, the records and the Client type; tensor.c the Tensor
 * type, its DLPack producer and the DLPack C exchange table; dlpack.c the
 * lease plumbing that needs no Python (shares, legacy wrappers, private
 * copies); put.c turns foreign arrays into daemon tensors.
 */
#ifndef TENSORD_PY_TDPY_H
#define TENSORD_PY_TDPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>

#include <tensord/tensord.h>

/* Only PyInit__tensord is exported (-fvisibility=hidden does the rest). */

/*
 * Keeps the exception in flight across code that runs foreign deleters,
 * which must neither lose it nor leave a new one. PyErr_Fetch is
 * deprecated from 3.12 on, so each version gets its own pair.
 */
#if PY_VERSION_HEX >= 0x030C0000
typedef struct {
	PyObject *exc;
} td_exc_state;
static inline td_exc_state td_exc_save(void)
{
	return (td_exc_state){PyErr_GetRaisedException()};
}
static inline void td_exc_restore(td_exc_state s)
{
	PyErr_SetRaisedException(s.exc);
}
#else
typedef struct {
	PyObject *type, *value, *tb;
} td_exc_state;
static inline td_exc_state td_exc_save(void)
{
	td_exc_state s;

	PyErr_Fetch(&s.type, &s.value, &s.tb);
	return s;
}
static inline void td_exc_restore(td_exc_state s)
{
	PyErr_Restore(s.type, s.value, s.tb);
}
#endif

typedef struct {
	PyObject_HEAD
	tensord_client *c; /* owned; NULL once closed */
	unsigned busy;     /* calls running with the GIL released; guarded by the GIL */
	bool closing;      /* close() was called; the last busy call closes c */
	PyObject *path;    /* str or None, as passed to connect() */
} ClientObject;

typedef struct {
	PyObject_HEAD
	/*
	 * Owned: this object's own lease, ended by release() or dealloc.
	 * NULL after release(). Every capsule and every exchange-table
	 * consumer gets its own share of it, so none of them depends on this
	 * object staying alive.
	 */
	DLManagedTensorVersioned *mt;
	ClientObject *client; /* strong reference; NULL for tensors not from a daemon */
	tensord_info info;    /* as of attach/create; kept after release() */
	bool named;           /* info describes a daemon tensor (name, nbytes, id) */
	bool readonly;        /* exports carry DLPACK_FLAG_BITMASK_READ_ONLY */
	PyObject *weakreflist;
} TensorObject;

extern PyTypeObject td_ClientType;
extern PyTypeObject td_TensorType;
extern PyTypeObject td_InfoType;

/* The C exchange table published on td_TensorType. */
extern const DLPackExchangeAPI td_exchange_api;

/*
 * Raises the tensord.Error subclass that matches rc (a -errno value from
 * libtensord), with tensord_last_error() as the message. Must be called on
 * the thread that made the failing call, before any other libtensord call.
 * Returns NULL.
 */
PyObject *td_raise(int rc);

/*
 * Brackets a libtensord call made with the GIL released: returns the handle
 * (or NULL with ValueError set when the client is closed) and keeps it alive
 * until td_client_leave(), even if another thread calls close() meanwhile.
 */
tensord_client *td_client_enter(ClientObject *self);
void td_client_leave(ClientObject *self);

/* A new Tensor that steals mt (its deleter runs on every failure path). */
PyObject *td_tensor_new(DLManagedTensorVersioned *mt, ClientObject *client);

/* Record type for stat()/list(). Returns a new reference. */
PyObject *td_info_new(const tensord_info *info);

/* Client.put(); in put.c. */
PyObject *td_client_put(ClientObject *self, PyObject *args, PyObject *kwds);

/* Parsers shared by create() and put(). 0 or -1 with an exception set. */
int td_parse_flags(PyObject *mutable_, PyObject *lifetime, PyObject *mode, uint32_t *flags,
		   uint32_t *mode_out);

/* --- dlpack.c: no Python in here, so all of it is safe on any thread. --- */

/*
 * Wraps orig, a DLManagedTensorVersioned from any producer, so that it can
 * be shared like a libtensord tensor: returns the first share, whose
 * deleter, with those of all later shares, ends orig. Steals orig. -ENOMEM
 * (orig's deleter has then run).
 */
int td_foreign_wrap(DLManagedTensorVersioned *orig, DLManagedTensorVersioned **ret);

/* True for the shares td_foreign_wrap() and td_share() make of foreign tensors. */
bool td_is_foreign(const DLManagedTensorVersioned *t);

/*
 * Another DLManagedTensorVersioned over the same memory as t (from
 * libtensord or td_foreign_wrap), ending nothing until its own deleter
 * runs. 0 or -errno.
 */
int td_share(DLManagedTensorVersioned *t, DLManagedTensorVersioned **ret);

/*
 * A private, malloc-backed host tensor with the dtype and shape of like,
 * row-major compact, 256-byte aligned. Its bytes are copied from like
 * (host memory, any strides) when copy is true. 0, -ENOMEM, -EINVAL.
 */
int td_host_tensor(const DLTensor *like, bool copy, uint64_t flags, DLManagedTensorVersioned **ret);

/* A legacy DLManagedTensor over t; steals t. NULL on ENOMEM (t is then ended). */
DLManagedTensor *td_legacy_wrap(DLManagedTensorVersioned *t);

/* Bytes of one element; 0 for types with no whole-byte size. */
size_t td_itemsize(DLDataType dt);

PyObject *td_dims_tuple(const int64_t *v, int n);

#endif /* TENSORD_PY_TDPY_H */
