"""Share tensors between processes by name, zero copy.

tensord is a local daemon that owns tensor memory; this module is its
Python client::

    import numpy as np, tensord
    with tensord.connect() as c:
        c.put("model/inputs/0", np.ones((4, 8), np.float32))
        with c.attach("model/inputs/0") as t:
            a = np.from_dlpack(t)          # a zero-copy, read-only view

Tensors are DLPack producers, so numpy.from_dlpack, torch.from_dlpack and
jax.dlpack.from_dlpack accept them. Errors are tensord.Error subclasses
that also inherit the matching built-in (FileNotFoundError, FileExistsError,
TimeoutError, PermissionError, ConnectionRefusedError).
"""
from ._tensord import (  # noqa: F401
    DLPACK_MAJOR_VERSION,
    DLPACK_MINOR_VERSION,
    PROTOCOL_VERSION,
    __version__,
    AccessDeniedError,
    Client,
    ClientInfo,
    ConnectionLostError,
    Error,
    Event,
    ExistsError,
    LeaseHolder,
    NoDaemonError,
    NotFoundError,
    PeerInfo,
    Tensor,
    TensorInfo,
    TimedOutError,
    Transaction,
    Watch,
    connect,
    default_socket_path,
)

__all__ = [
    "AccessDeniedError",
    "Client",
    "ClientInfo",
    "ConnectionLostError",
    "Error",
    "Event",
    "ExistsError",
    "LeaseHolder",
    "NoDaemonError",
    "NotFoundError",
    "PeerInfo",
    "Tensor",
    "TensorInfo",
    "TimedOutError",
    "Transaction",
    "Watch",
    "connect",
    "default_socket_path",
]
