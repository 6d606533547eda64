/*
 * Inspection from Python: Client.leases(), Client.clients(),
 * Client.peers() and Client.metrics(), and the tensord.LeaseHolder,
 * tensord.ClientInfo and tensord.PeerInfo records they return (named tuples, like TensorInfo).
 */
#include "tdpy.h"

#include <stdlib.h>

static PyStructSequence_Field holder_fields[] = {
	{ "name", "the tensor's name" },
	{ "tensor_id", "the tensor's id (unique for the daemon's life)" },
	{ "state", "'created', 'published' or 'unlinked' (still leased)" },
	{ "pid", "the holder's process id" },
	{ "uid", "the holder's uid" },
	{ "gid", "the holder's gid" },
	{ "comm", "the holder's command name when it connected; '' if unknown" },
	{ "count", "leases this connection holds on the tensor" },
	{ "since", "when the oldest of them began, seconds since the epoch" },
	{ "held", "how long ago that is, in seconds" },
	{ "conn_id", "the connection, as clients() lists it" },
	{ "label", "the holder's connection name (connect(name=...)); '' if none" },
	{ "bytes", "the tensor's size in bytes" },
	{ "commit", "the commit that published the tensor; 0 if never" },
	{ NULL, NULL },
};

static PyStructSequence_Desc holder_desc = {
	"tensord.LeaseHolder",
	"LeaseHolder(name, tensor_id, state, pid, uid, gid, comm, count, since, held, conn_id, "
	"label, bytes, commit)\n\n"
	"One connection's leases on one tensor; returned by Client.leases().",
	holder_fields,
	14,
};

static PyStructSequence_Field client_fields[] = {
	{ "conn_id", "the connection's id" },
	{ "pid", "the client's process id" },
	{ "uid", "the client's uid" },
	{ "gid", "the client's gid" },
	{ "comm", "its command name when it connected; '' if unknown" },
	{ "client", "what its library said when connecting" },
	{ "connected", "when it connected, seconds since the epoch" },
	{ "leases", "leases it holds" },
	{ "tensors_created", "tensors it created" },
	{ "waiters", "attaches it has waiting for a publish" },
	{ "bytes_queued", "reply bytes its socket has not taken yet" },
	{ "requests", "requests it sent" },
	{ "label", "its name (connect(name=...), $TENSORD_CLIENT_NAME); '' if none" },
	{ NULL, NULL },
};

static PyStructSequence_Desc client_desc = {
	"tensord.ClientInfo",
	"ClientInfo(conn_id, pid, uid, gid, comm, client, connected, leases, tensors_created, "
	"waiters, bytes_queued, requests, label)\n\n"
	"One client connection; returned by Client.clients().",
	client_fields,
	13,
};

static PyStructSequence_Field peer_fields[] = {
	{ "name", "the peer's node name" },
	{ "address", "HOST:PORT it is dialled at, or where it connected from" },
	{ "state", "'connecting', 'authenticating', 'up', 'down' or 'refused'" },
	{ "error", "the last error; '' when none" },
	{ "since", "when the state last changed, seconds since the epoch" },
	{ "instance", "its daemon's random id, new at each start; 0 before it authenticated" },
	{ "bytes_in", "bytes received from it (control channel)" },
	{ "bytes_out", "bytes sent to it" },
	{ "connects", "connections that came up" },
	{ "failures", "dials that failed, handshakes refused, connections lost" },
	{ "configured", "named with --peer (else it dialled in)" },
	{ "dialled", "up over the connection this daemon dialled" },
	{ "pulled", "replicas made of its tensors (remote attach)" },
	{ "pulled_bytes", "their bytes, received over the data path" },
	{ "pull_errors", "pulls from it that failed" },
	{ "served", "its pulls this daemon answered with bytes" },
	{ "served_bytes", "their bytes, sent" },
	{ "replicas", "replicas of its tensors here now" },
	{ "replica_bytes", "their bytes" },
	{ NULL, NULL },
};

static PyStructSequence_Desc peer_desc = {
	"tensord.PeerInfo",
	"PeerInfo(name, address, state, error, since, instance, bytes_in, bytes_out, connects, "
	"failures, configured, dialled, pulled, pulled_bytes, pull_errors, served, served_bytes, "
	"replicas, replica_bytes)\n\n"
	"One peer of the daemon (another node's tensord); returned by Client.peers().",
	peer_fields,
	19,
};

PyTypeObject td_LeaseHolderType, td_ClientInfoType, td_PeerInfoType;

int td_inspect_types_ready(void)
{
	if (td_LeaseHolderType.tp_name == NULL &&
	    PyStructSequence_InitType2(&td_LeaseHolderType, &holder_desc) < 0)
		return -1;
	if (td_ClientInfoType.tp_name == NULL &&
	    PyStructSequence_InitType2(&td_ClientInfoType, &client_desc) < 0)
		return -1;
	if (td_PeerInfoType.tp_name == NULL &&
	    PyStructSequence_InitType2(&td_PeerInfoType, &peer_desc) < 0)
		return -1;
	return 0;
}

static PyObject *holder_new(const tensord_lease_holder *h)
{
	static const char *const states[] = { "?", "created", "published", "unlinked" };
	PyObject *v[14];

	v[0] = PyUnicode_FromString(h->name);
	v[1] = PyLong_FromUnsignedLongLong(h->tensor_id);
	v[2] = PyUnicode_FromString(states[(unsigned)h->state <= 3 ? h->state : 0]);
	v[3] = PyLong_FromUnsignedLong(h->pid);
	v[4] = PyLong_FromUnsignedLong(h->uid);
	v[5] = PyLong_FromUnsignedLong(h->gid);
	v[6] = PyUnicode_FromString(h->comm);
	v[7] = PyLong_FromUnsignedLong(h->count);
	v[8] = PyFloat_FromDouble((double)h->since_ns / 1e9);
	v[9] = PyFloat_FromDouble((double)h->held_ns / 1e9);
	v[10] = PyLong_FromUnsignedLongLong(h->conn_id);
	v[11] = PyUnicode_FromString(h->label);
	v[12] = PyLong_FromUnsignedLongLong(h->bytes);
	v[13] = PyLong_FromUnsignedLongLong(h->commit);
	return td_record_new(&td_LeaseHolderType, v, 14);
}

static PyObject *client_info_new(const tensord_client_info *ci)
{
	PyObject *v[13];

	v[0] = PyLong_FromUnsignedLongLong(ci->conn_id);
	v[1] = PyLong_FromUnsignedLong(ci->pid);
	v[2] = PyLong_FromUnsignedLong(ci->uid);
	v[3] = PyLong_FromUnsignedLong(ci->gid);
	v[4] = PyUnicode_FromString(ci->comm);
	v[5] = PyUnicode_FromString(ci->client);
	v[6] = PyFloat_FromDouble((double)ci->connected_ns / 1e9);
	v[7] = PyLong_FromUnsignedLong(ci->leases);
	v[8] = PyLong_FromUnsignedLongLong(ci->tensors_created);
	v[9] = PyLong_FromUnsignedLong(ci->waiters);
	v[10] = PyLong_FromUnsignedLongLong(ci->bytes_queued);
	v[11] = PyLong_FromUnsignedLongLong(ci->requests);
	v[12] = PyUnicode_FromString(ci->label);
	return td_record_new(&td_ClientInfoType, v, 13);
}

/* A list of n records made by make from the array at v, elements of size sz. */
static PyObject *record_list(const void *v, size_t n, size_t sz, PyObject *(*make)(const void *))
{
	PyObject *list = PyList_New((Py_ssize_t)n);

	for (size_t i = 0; list && i < n; i++) {
		PyObject *r = make((const char *)v + i * sz);

		if (!r)
			Py_CLEAR(list);
		else
			PyList_SET_ITEM(list, (Py_ssize_t)i, r);
	}
	return list;
}

static PyObject *holder_make(const void *p)
{
	return holder_new(p);
}

static PyObject *client_make(const void *p)
{
	return client_info_new(p);
}

PyObject *td_client_leases(ClientObject *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = { "name", NULL };
	tensord_lease_holder *v = NULL;
	const char *name = NULL;
	tensord_client *c;
	PyObject *list;
	size_t n = 0;
	int rc;

	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|z:leases", kwlist, &name) ||
	    !(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = tensord_leases(c, name, &v, &n);
	Py_END_ALLOW_THREADS if (td_client_leave(self, rc) < 0) return NULL;
	list = record_list(v, n, sizeof(*v), holder_make);
	free(v);
	return list;
}

PyObject *td_client_clients(ClientObject *self, PyObject *unused)
{
	tensord_client_info *v = NULL;
	tensord_client *c;
	PyObject *list;
	size_t n = 0;
	int rc;

	if (!(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = tensord_clients(c, &v, &n);
	Py_END_ALLOW_THREADS if (td_client_leave(self, rc) < 0) return NULL;
	list = record_list(v, n, sizeof(*v), client_make);
	free(v);
	return list;
}

static PyObject *peer_make(const void *q)
{
	const tensord_peer_info *p = q;
	PyObject *v[19];

	v[0] = PyUnicode_FromString(p->name);
	v[1] = PyUnicode_FromString(p->address);
	v[2] = PyUnicode_FromString(p->state);
	v[3] = PyUnicode_FromString(p->error);
	v[4] = PyFloat_FromDouble((double)p->since_ns / 1e9);
	v[5] = PyLong_FromUnsignedLongLong(p->instance);
	v[6] = PyLong_FromUnsignedLongLong(p->bytes_in);
	v[7] = PyLong_FromUnsignedLongLong(p->bytes_out);
	v[8] = PyLong_FromUnsignedLongLong(p->connects);
	v[9] = PyLong_FromUnsignedLongLong(p->failures);
	v[10] = PyBool_FromLong(p->configured);
	v[11] = PyBool_FromLong(p->dialled);
	v[12] = PyLong_FromUnsignedLongLong(p->pulled);
	v[13] = PyLong_FromUnsignedLongLong(p->pulled_bytes);
	v[14] = PyLong_FromUnsignedLongLong(p->pull_errors);
	v[15] = PyLong_FromUnsignedLongLong(p->served);
	v[16] = PyLong_FromUnsignedLongLong(p->served_bytes);
	v[17] = PyLong_FromUnsignedLongLong(p->replicas);
	v[18] = PyLong_FromUnsignedLongLong(p->replica_bytes);
	return td_record_new(&td_PeerInfoType, v, 19);
}

PyObject *td_client_peers(ClientObject *self, PyObject *unused)
{
	tensord_peer_info *v = NULL;
	tensord_client *c;
	PyObject *list;
	size_t n = 0;
	int rc;

	if (!(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = tensord_peers(c, NULL, &v, &n);
	Py_END_ALLOW_THREADS if (td_client_leave(self, rc) < 0) return NULL;
	list = record_list(v, n, sizeof(*v), peer_make);
	free(v);
	return list;
}

PyObject *td_client_metrics(ClientObject *self, PyObject *unused)
{
	tensord_client *c;
	char *text = NULL;
	PyObject *s;
	int rc;

	if (!(c = td_client_enter(self)))
		return NULL;
	Py_BEGIN_ALLOW_THREADS rc = tensord_metrics(c, &text);
	Py_END_ALLOW_THREADS if (td_client_leave(self, rc) < 0) return NULL;
	s = PyUnicode_FromString(text);
	free(text);
	return s;
}
