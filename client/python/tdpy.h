/*
 * The tensord._tensord extension: shared declarations. One concern per file:
 *   module.c    the module, its functions and the tensord.Error classes
 *   client.c    the Client type; td_client_enter()/td_client_leave()
 *   args.c      Python arguments to dtypes, devices, dims, timeouts, flags
 *   records.c   TensorInfo records, the stats() dict, shape tuples
 *   tensor.c    the Tensor type and its __dlpack__ producer
 *   exchange.c  the DLPack C exchange table published on the Tensor type
 *   put.c       Client.put(): foreign arrays into daemon tensors
 *   sets.c      Client.transaction() and Transaction, put_many(), attach_many()
 *   files.c     Client.put_file() and get_file(): checkpoint files
 *   watch.c     Client.watch(), the Watch and Event types
 *   aio.c       the operations tensord.aio drives (the _Op type)
 *   buffer.c    the buffer protocol and __array__ on Tensor
 *   inspect.c   Client.leases(), clients() and metrics(), and their records
 *   dlpack.c    lease plumbing that needs no Python (shares, legacy
 *               wrappers, private copies)
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
	return (td_exc_state){ PyErr_GetRaisedException() };
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
	PyObject_HEAD tensord_client *c; /* owned; NULL once closed */
	unsigned busy;  /* calls running with the GIL released; guarded by the GIL */
	bool closing;   /* close() was called; the last busy call closes c */
	PyObject *path; /* str or None, as passed to connect() */
	unsigned forks; /* td_py_forks when busy was last right: a forked child
			   has none of the parent's calls in flight */
} ClientObject;

/* fork()s this process went through since the module loaded (client.c). */
extern unsigned td_py_forks;

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

/* --- buffer.c: the buffer protocol and __array__ of Tensor. ---------------- */

extern PyBufferProcs td_tensor_buffer;

/* Tensor.__array__(dtype=None, copy=None): numpy.from_dlpack(self), then a copy if asked. */
PyObject *td_tensor_array(TensorObject *self, PyObject *args, PyObject *kwds);

/* --- module.c ------------------------------------------------------------- */

/*
 * Raises the tensord.Error subclass that matches rc (a -errno value from
 * libtensord), with tensord_last_error() as the message. Must be called on
 * the thread that made the failing call, before any other libtensord call.
 * Returns NULL.
 */
PyObject *td_raise(int rc);

/* td_raise() for tensord_connect(): there -ENOENT (no socket) means no daemon. */
PyObject *td_raise_connect(int rc);

/* --- client.c ------------------------------------------------------------- */

extern PyTypeObject td_ClientType;

/*
 * Brackets a libtensord call made with the GIL released:
 *
 *	if (!(c = td_client_enter(self)))
 *		return NULL;
 *	Py_BEGIN_ALLOW_THREADS
 *	rc = tensord_xxx(c, ...);
 *	Py_END_ALLOW_THREADS
 *	if (td_client_leave(self, rc) < 0)
 *		return NULL;
 *
 * td_client_enter() returns the handle, or NULL with ValueError set when
 * the client is closed. Borrowed: the handle is valid until
 * td_client_leave(), even if another thread calls close() meanwhile.
 * td_client_leave() raises for rc < 0 (before the close a pending close()
 * may do, which would reset tensord_last_error()) and returns rc.
 */
tensord_client *td_client_enter(ClientObject *self);
int td_client_leave(ClientObject *self, int rc);

/* --- args.c: 0 (or a count) on success, -1 with an exception set. --------- */

/* The mutable, lifetime and mode keywords of create() and put(); NULL: not given. */
int td_parse_flags(PyObject *mutable_, PyObject *lifetime, PyObject *mode, uint32_t *flags,
		   uint32_t *mode_out);

/*
 * dtype: a string ("float32"), or anything whose .name or str() is one, so
 * numpy dtypes and torch dtypes ("torch.float32") work too.
 */
int td_parse_dtype(PyObject *o, DLDataType *ret);

/* "cpu", "cuda:N", "rocm:N", or anything whose str() is one. */
int td_parse_device(PyObject *o, DLDevice *ret);

/* An int or a sequence of at most TENSORD_NDIM_MAX ints into out; returns ndim. */
int td_parse_dims(PyObject *o, const char *what, int64_t *out);

/* None: do not wait (0); seconds: wait that long; math.inf: wait forever (-1). */
int td_parse_timeout(PyObject *o, int *ms);

/* A (type, id) pair such as __dlpack_device__() returns. */
int td_parse_device_pair(PyObject *o, const char *what, DLDevice *ret);

/* create()'s arguments, Client's and Transaction's: spec points into shape and strides. */
struct td_create_args {
	const char *name; /* borrowed from args */
	tensord_spec spec;
	int64_t shape[TENSORD_NDIM_MAX], strides[TENSORD_NDIM_MAX];
};

/*
 * (name, shape, dtype, device='cpu', mutable=False, lifetime='persistent',
 * mode=None, strides=None, *, replace=False) into *a, which must stay where
 * it is while a->spec is used.
 */
int td_parse_create(PyObject *args, PyObject *kwds, struct td_create_args *a);

/* --- records.c: each returns a new reference, or NULL with an exception set. */

extern PyTypeObject td_InfoType;

/* Initialises td_InfoType once; 0 or -1. */
int td_info_type_ready(void);

/* A TensorInfo record for stat(). */
PyObject *td_info_new(const tensord_info *info);

/* A list of TensorInfo records for list(). Borrowed: infos, only for the call. */
PyObject *td_info_list(const tensord_info *infos, size_t n);

/*
 * A struct sequence of type from n new references in v, which it steals;
 * when any is NULL (a failed conversion) all are released and NULL is
 * returned with that exception set.
 */
PyObject *td_record_new(PyTypeObject *type, PyObject **v, int n);

/* --- inspect.c: Client.leases(), clients(), metrics() and their records. */

extern PyTypeObject td_LeaseHolderType, td_ClientInfoType, td_PeerInfoType;

/* Initialises the record types once; 0 or -1. */
int td_inspect_types_ready(void);

PyObject *td_client_leases(ClientObject *self, PyObject *args, PyObject *kwds);
PyObject *td_client_clients(ClientObject *self, PyObject *unused);
PyObject *td_client_peers(ClientObject *self, PyObject *unused);
PyObject *td_client_metrics(ClientObject *self, PyObject *unused);

/* A tuple of Python ints from v[0..n). */
PyObject *td_dims_tuple(const int64_t *v, int n);

/* --- tensor.c --------------------------------------------------------------- */

extern PyTypeObject td_TensorType;

/*
 * A new Tensor over mt. Takes ownership of mt: its deleter runs on every
 * failure path. Holds a strong reference to client (NULL: none). Returns a
 * new reference.
 */
PyObject *td_tensor_new(DLManagedTensorVersioned *mt, ClientObject *client);

/*
 * A share of self's lease for one consumer, READ_ONLY when self is. On
 * success *ret is owned by the caller, who ends it with its deleter.
 * 0, or -1 with BufferError (released) or a td_raise() error set.
 */
int td_tensor_share(TensorObject *self, DLManagedTensorVersioned **ret);

/* The name for messages. Borrowed: valid while self lives. */
const char *td_tensor_label(TensorObject *self);

/* --- exchange.c ------------------------------------------------------------- */

/* Sets the exchange table on td_TensorType (after PyType_Ready); 0 or -1. */
int td_exchange_api_publish(void);

/* --- put.c ------------------------------------------------------------------ */

/* Client.put(). Returns a new reference (None), or NULL with an exception set. */
PyObject *td_client_put(ClientObject *self, PyObject *args, PyObject *kwds);

/* What keeps a put()'s source memory alive until the copy is done (put.c). */
struct td_source {
	DLManagedTensorVersioned *versioned; /* owned: consumed capsule contents, or NULL */
	DLManagedTensor *legacy;             /* likewise */
	Py_buffer view;                      /* owned when have_view */
	bool have_view;
	DLTensor dl;                     /* what tensord_put reads; points into the above */
	int64_t shape[TENSORD_NDIM_MAX]; /* for buffers, whose shape is Py_ssize_t */
	int64_t strides[TENSORD_NDIM_MAX];
};

/*
 * The source of obj (a DLPack producer or capsule, or a buffer) into *s,
 * which holds what keeps it alive even on failure: release it with
 * td_source_release() (GIL held) either way. 0, or -1 with an exception.
 */
int td_source_from(struct td_source *s, PyObject *obj);
void td_source_release(struct td_source *s);

/* td_client_leave() for a put: -EFAULT (an unreadable source) is a ValueError. */
int td_put_leave(ClientObject *self, int rc);

/* CLOCK_MONOTONIC in milliseconds (client.c). */
double td_now_ms(void);

/*
 * How long one wait (attach, attach_many, a watch's next) lasts before
 * Python's signal handlers get a turn.
 */
#define TD_WAIT_SLICE_MS 100

/*
 * The next slice of a wait of ms (-1: no limit) that ends at deadline
 * (td_now_ms() + ms): ms itself when it is one slice or less, else at most
 * TD_WAIT_SLICE_MS and never past the deadline, at least 1 (client.c).
 */
int td_wait_slice(int ms, double deadline);

/*
 * Whether a wait sliced by td_wait_slice() goes on after a slice's rc: it
 * timed out with time left, or the daemon went away (c's connection lost,
 * tensord_lost(), or replaced since the slice began in epoch seen, or no
 * daemon yet: the next slice connects anew) and neither the wait's time
 * nor the reconnect grace (TENSORD_RECONNECT_MS, 30 s) ran out since
 * *lost_since (0: not lost; kept by the caller across slices).
 */
bool td_wait_goes_on(tensord_client *c, int rc, unsigned seen, int ms, double deadline,
		     double *lost_since);

/* after=: None (0) or an int >= 0 into *ret. 0 or -1 with an exception. */
int td_parse_after(PyObject *o, uint64_t *ret);

/* timeout= and after= of a wait: *ms as td_parse_timeout(), but None waits forever with after. */
int td_parse_wait(PyObject *timeout, PyObject *after, int *ms, uint64_t *ret_after);

/*
 * Client methods of sets.c (transaction, put_many, attach_many), watch.c
 * (watch) and aio.c (fileno, _poll, _attach_start, _attach_many_start,
 * _restart_state, _reconnect), and
 * their types: Transaction, Event and Watch onto mod; _Op only readied.
 */
PyObject *td_client_transaction(ClientObject *self, PyObject *unused);
PyObject *td_client_put_many(ClientObject *self, PyObject *args, PyObject *kwds);
PyObject *td_client_attach_many(ClientObject *self, PyObject *args, PyObject *kwds);
PyObject *td_client_watch(ClientObject *self, PyObject *args, PyObject *kwds);
PyObject *td_client_attach_start(ClientObject *self, PyObject *args);
PyObject *td_client_attach_many_start(ClientObject *self, PyObject *args);
PyObject *td_client_poll(ClientObject *self, PyObject *unused);
PyObject *td_client_fileno(ClientObject *self, PyObject *unused);
PyObject *td_client_restart_state(ClientObject *self, PyObject *unused);
PyObject *td_client_reconnect(ClientObject *self, PyObject *unused);
PyObject *td_client_put_file(ClientObject *self, PyObject *args, PyObject *kwds);
PyObject *td_client_get_file(ClientObject *self, PyObject *args, PyObject *kwds);
int td_sets_types_ready(PyObject *mod);
int td_watch_types_ready(PyObject *mod);
int td_aio_types_ready(void);

/*
 * sets.c, for aio.c: the names of a list (any iterable but a str), checked
 * and held in *ret (n of them; the strings borrowed from *ret_keep, a new
 * list). A str is a prefix: *ret NULL. 0 or -1 with an exception.
 */
int td_set_names(PyObject *what, const char ***ret, size_t *ret_n, PyObject **ret_keep);

/* sets.c, for aio.c: a dict name -> Tensor from set (consumed: every tensor taken, set freed). */
PyObject *td_set_dict(tensord_set *set, ClientObject *client);

/* The Client methods sets.c, watch.c and aio.c provide, for client.c's table. */
#define TD_SETS_METHODS                                                                            \
	{ "transaction", (PyCFunction)td_client_transaction, METH_NOARGS,                          \
	  "transaction($self, /)\n--\n\n"                                                          \
	  "A Transaction: puts, creates and unlinks made visible by its commit() in one\n"         \
	  "daemon step, with one commit id, or not at all. A context manager: leaving the\n"       \
	  "block commits, an exception aborts." },                                                 \
		{ "put_many", (PyCFunction)(void (*)(void))td_client_put_many,                     \
		  METH_VARARGS | METH_KEYWORDS,                                                    \
		  "put_many($self, mapping, /, *, mutable=False, lifetime='persistent', "          \
		  "mode=None, replace=False, sealed=False)\n--\n\n"                                \
		  "Puts every name -> array of mapping as one commit; returns the commit id." },   \
		{ "attach_many", (PyCFunction)(void (*)(void))td_client_attach_many,               \
		  METH_VARARGS | METH_KEYWORDS,                                                    \
		  "attach_many($self, names_or_prefix, /, *, after=None, timeout=None)\n--\n\n"    \
		  "Returns dict name -> Tensor, leased in one daemon step: a str is a prefix\n"    \
		  "(every name under it), anything else an iterable of names (a missing name:\n"   \
		  "NotFoundError naming it, unless waiting). after: a commit id; at once if a\n"   \
		  "newer commit touched those names, else waits for one (timeout=None: "           \
		  "forever)." },                                                                   \
		{ "put_file", (PyCFunction)(void (*)(void))td_client_put_file,                     \
		  METH_VARARGS | METH_KEYWORDS,                                                    \
		  "put_file($self, prefix, path, *, replace=False, mutable=False, "                \
		  "lifetime='persistent', mode=None)\n--\n\n"                                      \
		  "Imports every array of a .safetensors, .npz or .npy file as prefix + its "      \
		  "name,\n"                                                                        \
		  "in one commit (returned); prefix ends in '/' (or '.', '_', ':', '-'). A "       \
		  ".npy's\n"                                                                       \
		  "one array is named prefix. replace: the next version of names you own." },      \
		{ "get_file", (PyCFunction)(void (*)(void))td_client_get_file,                     \
		  METH_VARARGS | METH_KEYWORDS,                                                    \
		  "get_file($self, prefix_or_names, path)\n--\n\n"                                 \
		  "Writes tensors to one .safetensors, .npz or .npy file (format from the "        \
		  "suffix),\n"                                                                     \
		  "all from one commit (returned): a str is a prefix (names stored without it; "   \
		  "for\n"                                                                          \
		  "a .npy, the one tensor's name), anything else an iterable of whole names." },   \
		{ "watch", (PyCFunction)(void (*)(void))td_client_watch,                           \
		  METH_VARARGS | METH_KEYWORDS,                                                    \
		  "watch($self, /, prefix='', *, after=None, queue=None)\n--\n\n"                  \
		  "A Watch: an iterator of Event(kind, name, generation, commit) for the names\n"  \
		  "under prefix you may read, live from when watch() returns. after: a commit\n"   \
		  "id; first the current state of names committed after it. queue: events kept\n"  \
		  "for a watch that is not read (default 1024), then coalesced: 'lagged'. It\n"    \
		  "goes on across a daemon restart ('restarted': the new one started empty)." },   \
		{ "fileno", (PyCFunction)td_client_fileno, METH_NOARGS,                            \
		  "fileno($self, /)\n--\n\nThe connection's descriptor (for event loops)." },      \
		{ "_poll", (PyCFunction)td_client_poll, METH_NOARGS, NULL },                       \
		{ "_attach_start", (PyCFunction)td_client_attach_start, METH_VARARGS, NULL },      \
		{ "_attach_many_start", (PyCFunction)td_client_attach_many_start, METH_VARARGS,    \
		  NULL },                                                                          \
		{ "_restart_state", (PyCFunction)td_client_restart_state, METH_NOARGS, NULL },     \
		{ "_reconnect", (PyCFunction)td_client_reconnect, METH_NOARGS, NULL },

/* --- dlpack.c: no Python in here, so all of it is safe on any thread. --- */

/*
 * Wraps orig, a DLManagedTensorVersioned from any producer, so that it can
 * be shared like a libtensord tensor: returns the first share, whose
 * deleter, with those of all later shares, ends orig. Takes ownership of
 * orig: on -ENOMEM its deleter has run. *ret is owned by the caller.
 */
int td_foreign_wrap(DLManagedTensorVersioned *orig, DLManagedTensorVersioned **ret);

/* True for the shares td_foreign_wrap() and td_share() make of foreign tensors. */
bool td_is_foreign(const DLManagedTensorVersioned *t);

/*
 * Another DLManagedTensorVersioned over the same memory as t (from
 * libtensord or td_foreign_wrap), ending nothing until its own deleter
 * runs. Borrowed: t, only for the call. *ret is owned by the caller.
 * 0 or -errno.
 */
int td_share(DLManagedTensorVersioned *t, DLManagedTensorVersioned **ret);

/*
 * A private, malloc-backed host tensor with the dtype and shape of like,
 * row-major compact, 256-byte aligned. Its bytes are copied from like
 * (host memory, any strides) when copy is true. Borrowed: like, only for
 * the call. *ret, written only on success, is owned by the caller and
 * ended by its deleter. 0, -ENOMEM, -EINVAL.
 */
int td_host_tensor(const DLTensor *like, bool copy, uint64_t flags, DLManagedTensorVersioned **ret);

/*
 * A legacy DLManagedTensor over t, owned by the caller and ended by its
 * deleter. Takes ownership of t: on NULL (ENOMEM) t has been ended.
 */
DLManagedTensor *td_legacy_wrap(DLManagedTensorVersioned *t);

/* Bytes of one element; 0 for types with no whole-byte size. */
size_t td_itemsize(DLDataType dt);

#endif /* TENSORD_PY_TDPY_H */
