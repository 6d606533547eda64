/*
 * Error names and messages: the public tensord_strerror() and
 * tensord_err_name(), fed by one table so that the two never disagree.
 */
#include <errno.h>

#include <tensord/tensord.h>

/* One table feeds tensord_strerror() and tensord_err_name(). */
#define TENSORD_ERRNO_MAP(XX)                                                                      \
	XX(ENOENT, "no such tensor")                                                               \
	XX(EEXIST, "tensor exists")                                                                \
	XX(EINVAL, "invalid argument")                                                             \
	XX(ENOSPC, "over capacity")                                                                \
	XX(EDQUOT, "over this user's share")                                                       \
	XX(ENODEV, "no backend for device")                                                        \
	XX(EPERM, "operation not permitted")                                                       \
	XX(EACCES, "permission denied")                                                            \
	XX(ETIMEDOUT, "timed out")                                                                 \
	XX(EPROTO, "protocol error")                                                               \
	XX(ECONNREFUSED, "no daemon at socket")                                                    \
	XX(ENOTSOCK, "not a socket")                                                               \
	XX(ECONNRESET, "connection to daemon lost")                                                \
	XX(EPIPE, "connection to daemon lost")                                                     \
	XX(ENOTCONN, "client is closed")                                                           \
	XX(EBUSY, "busy: writable mappings remain")                                                \
	XX(EMSGSIZE, "message too large")                                                          \
	XX(EBADMSG, "malformed message")                                                           \
	XX(ENOMEM, "out of memory")                                                                \
	XX(EFBIG, "tensor too large")                                                              \
	XX(EMFILE, "too many open files")                                                          \
	XX(EAGAIN, "resource limit reached, try again")                                            \
	XX(ENOTSUP, "not supported")                                                               \
	XX(ENAMETOOLONG, "name too long")                                                          \
	XX(ESRCH, "no such lease")                                                                 \
	XX(ECANCELED, "cancelled (a wait, or a create whose tensor or creator went)")              \
	XX(EFAULT, "bad address: the source is not readable memory")                               \
	XX(EPROTONOSUPPORT, "the daemon is older than this library")                               \
	XX(E2BIG, "too many: past a limit")

const char *tensord_strerror(int err)
{
	if (err < 0)
		err = -err;
	switch (err) {
	case 0:
		return "success";
#define XX(code, msg)                                                                              \
	case code:                                                                                 \
		return msg;
		TENSORD_ERRNO_MAP(XX)
#undef XX
	default:
		return "unknown error";
	}
}

const char *tensord_err_name(int err)
{
	if (err < 0)
		err = -err;
	switch (err) {
	case 0:
		return "OK";
#define XX(code, msg)                                                                              \
	case code:                                                                                 \
		return #code;
		TENSORD_ERRNO_MAP(XX)
#undef XX
	default:
		return "EUNKNOWN";
	}
}
