"""A CUDA consumer with no framework: the driver API through ctypes.

Tests that must run both on hardware and over the driver double
(tests/gpudouble/, selected with LD_LIBRARY_PATH) use this instead of torch
or cupy, which the CPU-only wheels of a machine without a GPU cannot load.
It reads and writes a tensord Tensor's device memory through the pointer
its DLPack capsule carries, on the device the capsule names.
"""
import ctypes

cu = ctypes.CDLL("libcuda.so.1")
P = ctypes.c_uint64
_get = ctypes.pythonapi.PyCapsule_GetPointer
_get.restype = ctypes.c_void_p
_get.argtypes = [ctypes.py_object, ctypes.c_char_p]


class CudaError(RuntimeError):
    def __init__(self, what, code):
        name = ctypes.c_char_p()
        cu.cuGetErrorName(code, ctypes.byref(name))
        super().__init__(f"{what}: {(name.value or b'?').decode()}")
        self.code = code
        self.name = (name.value or b"?").decode()


def ok(r, what):
    if r != 0:
        raise CudaError(what, r)


_ctx = {}


def enter(ordinal):
    """Makes this process's primary context of device ordinal current."""
    if ordinal not in _ctx:
        ok(cu.cuInit(0), "cuInit")
        ctx = ctypes.c_void_p()
        ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), ordinal), "cuDevicePrimaryCtxRetain")
        _ctx[ordinal] = ctx
    ok(cu.cuCtxSetCurrent(_ctx[ordinal]), "cuCtxSetCurrent")


def pointer(t):
    """(device pointer, device ordinal, capsule) of a CUDA tensor's DLPack view.

    Keep the capsule while the pointer is used: dropping it ends the lease."""
    cap = t.__dlpack__(max_version=(1, 0))
    p = _get(cap, b"dltensor_versioned")
    # DLManagedTensorVersioned: version, manager_ctx, deleter, flags, then DLTensor
    # (data, device {type, id}, ndim, dtype, shape, strides, byte_offset).
    dl = p + 32
    data = ctypes.c_uint64.from_address(dl).value
    dev_type, dev_id = (ctypes.c_int32.from_address(dl + 8).value,
                        ctypes.c_int32.from_address(dl + 12).value)
    assert dev_type == 2, f"not a CUDA tensor (device type {dev_type})"
    return data + ctypes.c_uint64.from_address(dl + 40).value, dev_id, cap


def write(t, data):
    ptr, dev, cap = pointer(t)
    enter(dev)
    ok(cu.cuMemcpyHtoD_v2(P(ptr), data, P(len(data))), "cuMemcpyHtoD")
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    del cap


def read(t, n=None):
    ptr, dev, cap = pointer(t)
    n = t.nbytes if n is None else n
    buf = ctypes.create_string_buffer(n)
    enter(dev)
    ok(cu.cuMemcpyDtoH_v2(buf, P(ptr), P(n)), "cuMemcpyDtoH")
    del cap
    return buf.raw


def memset(t, value):
    """A kernel writing every byte, waited for: raises CudaError if refused."""
    ptr, dev, cap = pointer(t)
    enter(dev)
    ok(cu.cuMemsetD8_v2(P(ptr), value, P(t.nbytes)), "cuMemsetD8")
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    del cap


def read_queued_then_drop(t):
    """Queues a read of t on a stream, drops every reference to t's memory,
    then waits: what a consumer does when torch frees a temporary."""
    ptr, dev, cap = pointer(t)
    n = t.nbytes
    buf = ctypes.create_string_buffer(n)
    enter(dev)
    s = ctypes.c_void_p()
    ok(cu.cuStreamCreate(ctypes.byref(s), 0), "cuStreamCreate")
    ok(cu.cuMemcpyDtoHAsync_v2(buf, P(ptr), P(n), s), "cuMemcpyDtoHAsync")
    del cap
    t.release()
    ok(cu.cuStreamSynchronize(s), "cuStreamSynchronize")
    cu.cuStreamDestroy_v2(s)
    return buf.raw


def calls(fn):
    """How many calls of driver entry point fn ("cuMemImportFromShareableHandle",
    "cuIpcOpenMemHandle_v2") this process made so far, where the driver is the
    double (tests/gpudouble/cuda.c, tdDoubleCalls); None on a real driver."""
    f = getattr(cu, "tdDoubleCalls", None)
    if f is None:
        return None
    f.restype = ctypes.c_ulong
    f.argtypes = [ctypes.c_char_p]
    return f(fn.encode())
