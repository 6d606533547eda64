"""Type stubs for tensord, the Python client of the tensord daemon."""
import os
from types import TracebackType
from typing import (
    Any,
    ClassVar,
    Final,
    Iterable,
    Iterator,
    Literal,
    Mapping,
    Sequence,
    SupportsIndex,
    final,
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

__version__: str
DLPACK_MAJOR_VERSION: int
DLPACK_MINOR_VERSION: int
PROTOCOL_VERSION: int

_DType = str | Any  # a name such as "float32"; numpy and torch dtypes also work
_Lifetime = Literal["persistent", "connection"]
_State = Literal["created", "published", "unlinked"]

class Error(OSError):
    """Base of every tensord error; .errno is the daemon's code."""

class NotFoundError(Error, FileNotFoundError):
    """No such tensor (ENOENT)."""

class ExistsError(Error, FileExistsError):
    """The name is taken (EEXIST)."""

class TimedOutError(Error, TimeoutError):
    """attach() waited its timeout out (ETIMEDOUT)."""

class AccessDeniedError(Error, PermissionError):
    """Refused by the tensor's owner or mode (EPERM, EACCES)."""

class NoDaemonError(Error, ConnectionRefusedError):
    """No daemon listens on the socket (ECONNREFUSED, ENOENT)."""

class ConnectionLostError(Error, ConnectionResetError):
    """The connection was lost (the daemon crashed or restarted) with the
    request in flight; the same client's next request connects anew."""

@final
class TensorInfo(tuple[Any, ...]):
    """One tensor as the daemon describes it."""

    n_fields: ClassVar[int]
    n_sequence_fields: ClassVar[int]
    n_unnamed_fields: ClassVar[int]
    __match_args__: Final = ("name", "dtype", "shape", "strides", "device", "nbytes", "state",
                             "refcount", "owner_uid", "owner_gid", "mode", "mutable",
                             "lifetime", "created", "id", "generation", "commit")
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def device(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def state(self) -> _State: ...
    @property
    def refcount(self) -> int: ...
    @property
    def owner_uid(self) -> int: ...
    @property
    def owner_gid(self) -> int: ...
    @property
    def mode(self) -> int: ...
    @property
    def mutable(self) -> bool: ...
    @property
    def lifetime(self) -> _Lifetime: ...
    @property
    def created(self) -> float: ...
    @property
    def id(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def commit(self) -> int: ...

_EventKind = Literal["published", "unlinked", "lagged", "restarted"]

@final
class Event(tuple[Any, ...]):
    """One change a watch reports."""

    n_fields: ClassVar[int]
    n_sequence_fields: ClassVar[int]
    n_unnamed_fields: ClassVar[int]
    __match_args__: Final = ("kind", "name", "generation", "commit")
    @property
    def kind(self) -> _EventKind: ...
    @property
    def name(self) -> str: ...
    @property
    def generation(self) -> int: ...
    @property
    def commit(self) -> int: ...

# The daemon's figures, the object `tensorctl stats --json` prints: each
# daemon figure by name (an int, a float for seconds, or a dict by label
# value), "devices" and "uids" lists of dicts. The daemon defines the figures
# (docs/operating.md, "Metrics"), so the keys are not fixed here.
_Stats = dict[str, Any]

@final
class Tensor:
    """A lease on one daemon tensor; a DLPack producer and a context manager."""

    __dlpack_c_exchange_api__: Any  # PyCapsule "dlpack_exchange_api"
    __c_dlpack_exchange_api__: int

    @property
    def name(self) -> str | None: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def readonly(self) -> bool: ...
    @property
    def read_only_enforced(self) -> bool: ...
    @property
    def mutable(self) -> bool: ...
    @property
    def released(self) -> bool: ...
    @property
    def generation(self) -> int: ...
    @property
    def commit(self) -> int: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        """Exports the tensor as a DLPack capsule (versioned when max_version >= (1, 0))."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """(device type, device id) as DLPack numbers them."""
    def publish(self) -> int:
        """Makes a created tensor visible; immutable unless created mutable."""
    def release(self) -> None:
        """Ends this object's lease; arrays made from it stay valid."""
    def __enter__(self) -> Tensor: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

@final
class LeaseHolder(tuple[Any, ...]):
    """One connection's leases on one tensor."""

    n_fields: ClassVar[int]
    n_sequence_fields: ClassVar[int]
    n_unnamed_fields: ClassVar[int]
    __match_args__: Final = ("name", "tensor_id", "state", "pid", "uid", "gid", "comm",
                             "count", "since", "held", "conn_id", "label", "bytes", "commit")
    @property
    def name(self) -> str: ...
    @property
    def tensor_id(self) -> int: ...
    @property
    def state(self) -> _State: ...
    @property
    def pid(self) -> int: ...
    @property
    def uid(self) -> int: ...
    @property
    def gid(self) -> int: ...
    @property
    def comm(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def since(self) -> float: ...
    @property
    def held(self) -> float: ...
    @property
    def conn_id(self) -> int: ...
    @property
    def label(self) -> str: ...
    @property
    def bytes(self) -> int: ...
    @property
    def commit(self) -> int: ...

@final
class ClientInfo(tuple[Any, ...]):
    """One client connection."""

    n_fields: ClassVar[int]
    n_sequence_fields: ClassVar[int]
    n_unnamed_fields: ClassVar[int]
    __match_args__: Final = ("conn_id", "pid", "uid", "gid", "comm", "client", "connected",
                             "leases", "tensors_created", "waiters", "bytes_queued",
                             "requests", "label")
    @property
    def conn_id(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def uid(self) -> int: ...
    @property
    def gid(self) -> int: ...
    @property
    def comm(self) -> str: ...
    @property
    def client(self) -> str: ...
    @property
    def connected(self) -> float: ...
    @property
    def leases(self) -> int: ...
    @property
    def tensors_created(self) -> int: ...
    @property
    def waiters(self) -> int: ...
    @property
    def bytes_queued(self) -> int: ...
    @property
    def requests(self) -> int: ...
    @property
    def label(self) -> str: ...

@final
class PeerInfo(tuple[Any, ...]):
    """One peer of the daemon: another node's tensord."""

    n_fields: ClassVar[int]
    n_sequence_fields: ClassVar[int]
    n_unnamed_fields: ClassVar[int]
    __match_args__: Final = ("name", "address", "state", "error", "since", "instance",
                             "bytes_in", "bytes_out", "connects", "failures", "configured",
                             "dialled")
    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def error(self) -> str: ...
    @property
    def since(self) -> float: ...
    @property
    def instance(self) -> int: ...
    @property
    def bytes_in(self) -> int: ...
    @property
    def bytes_out(self) -> int: ...
    @property
    def connects(self) -> int: ...
    @property
    def failures(self) -> int: ...
    @property
    def configured(self) -> bool: ...
    @property
    def dialled(self) -> bool: ...

@final
class Client:
    """A connection to a tensord daemon; thread-safe; a context manager."""

    def __new__(cls, path: str | os.PathLike[str] | None = None) -> Client: ...
    @property
    def path(self) -> str | os.PathLike[str] | None: ...
    @property
    def closed(self) -> bool: ...
    def put(
        self,
        name: str,
        obj: Any,
        mutable: bool = False,
        lifetime: _Lifetime = "persistent",
        mode: int | None = None,
        *,
        replace: bool = False,
        sealed: bool = False,
    ) -> int:
        """Copies a DLPack producer or buffer into a new tensor and publishes it;
        returns the name's new generation."""
    def attach(self, name: str, timeout: float | None = None, *,
               after: int | None = None) -> Tensor:
        """Attaches a published tensor, zero copy; waits up to timeout seconds.
        after: a generation; a newer one is attached, or waited for."""
    def transaction(self) -> Transaction:
        """Puts, creates and unlinks made visible together by commit()."""
    def put_many(
        self,
        mapping: Mapping[str, Any],
        *,
        mutable: bool = False,
        lifetime: _Lifetime = "persistent",
        mode: int | None = None,
        replace: bool = False,
        sealed: bool = False,
    ) -> int:
        """Puts every name -> array as one commit; returns the commit id."""
    def attach_many(self, names_or_prefix: str | Iterable[str], *, after: int | None = None,
                    timeout: float | None = None) -> dict[str, Tensor]:
        """Attaches a set in one daemon step: a prefix (str) or names."""
    def put_file(
        self,
        prefix: str,
        path: str | os.PathLike[str],
        *,
        replace: bool = False,
        mutable: bool = False,
        lifetime: _Lifetime = "persistent",
        mode: int | None = None,
    ) -> int:
        """Imports every array of a .safetensors/.npz/.npy file as prefix + its
        name, in one commit (returned). prefix ends in '/', '.', '_', ':' or '-'
        (or is empty); a .npy's one array is named prefix."""
    def get_file(self, prefix_or_names: str | Iterable[str],
                 path: str | os.PathLike[str]) -> int:
        """Writes a prefix's tensors (stored without it) or the listed names to one
        .safetensors/.npz/.npy file, all from one commit (returned)."""
    def watch(self, prefix: str = "", *, after: int | None = None,
              queue: int | None = None) -> Watch:
        """Events for the names under prefix, live from when watch() returns."""
    def fileno(self) -> int:
        """The connection's descriptor (for event loops)."""
    def create(
        self,
        name: str,
        shape: SupportsIndex | Sequence[SupportsIndex],
        dtype: _DType,
        device: str = "cpu",
        mutable: bool = False,
        lifetime: _Lifetime = "persistent",
        mode: int | None = None,
        strides: Sequence[SupportsIndex] | None = None,
        *,
        replace: bool = False,
        recycle: bool = False,
    ) -> Tensor:
        """Allocates a tensor, writable by the caller until publish()."""
    def stat(self, name: str) -> TensorInfo:
        """Describes one tensor."""
    def list(self, prefix: str = "") -> list[TensorInfo]:
        """Describes every tensor whose name starts with prefix."""
    def stats(self) -> _Stats:
        """The daemon's figures, as `tensorctl stats --json` prints them."""
    def leases(self, name: str | None = None) -> list[LeaseHolder]:
        """Who holds leases on name (None: every tensor the caller may read)."""
    def clients(self) -> list[ClientInfo]:
        """Client connections: all for root, the caller's uid's for others."""
    def peers(self) -> list[PeerInfo]:
        """Other nodes' daemons this one peers with: root and the daemon's uid only."""
    def metrics(self) -> str:
        """The daemon's metrics, Prometheus text format 0.0.4."""
    def unlink(self, name: str) -> None:
        """Removes the name; memory lives until the last lease ends."""
    def close(self) -> None:
        """Closes the connection."""
    def __enter__(self) -> Client: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

@final
class Transaction:
    """Staged changes made visible in one daemon step by commit()."""

    @property
    def commit_id(self) -> int | None: ...
    def put(
        self,
        name: str,
        obj: Any,
        mutable: bool = False,
        lifetime: _Lifetime = "persistent",
        mode: int | None = None,
        *,
        replace: bool = False,
        sealed: bool = False,
    ) -> None:
        """Stages a put, as Client.put()."""
    def create(
        self,
        name: str,
        shape: SupportsIndex | Sequence[SupportsIndex],
        dtype: _DType,
        device: str = "cpu",
        mutable: bool = False,
        lifetime: _Lifetime = "persistent",
        mode: int | None = None,
        strides: Sequence[SupportsIndex] | None = None,
        *,
        replace: bool = False,
        recycle: bool = False,
    ) -> Tensor:
        """Stages a create, as Client.create()."""
    def unlink(self, name: str, /) -> None:
        """Stages the unlink of a published name."""
    def commit(self) -> int:
        """Publishes and unlinks everything staged in one step; the commit id."""
    def abort(self) -> None:
        """Discards everything staged."""
    def __enter__(self) -> Transaction: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...

@final
class Watch(Iterator[Event]):
    """An iterator of Event for the names under a prefix."""

    def __next__(self) -> Event: ...
    def next(self, timeout: float | None = None) -> Event:
        """The next Event, waiting up to timeout seconds."""
    def poll(self) -> Event | None:
        """The next Event if one is there, else None."""
    def close(self) -> None:
        """Ends the watch."""
    def __enter__(self) -> Watch: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

def connect(path: str | os.PathLike[str] | None = None, *, name: str | None = None) -> Client:
    """Connects to the daemon at path, or at the default socket path and then
    /run/tensord/tensord.sock. The socket, its directory and the daemon
    (SO_PEERCRED) must belong to you, root or $TENSORD_DAEMON_UID.
    name labels the connection in clients(), leases() and tensorctl (1 to
    63 bytes of printable ASCII without spaces; None: $TENSORD_CLIENT_NAME
    when set); one that is not valid raises Error (EINVAL).
    NoDaemonError (ConnectionRefusedError): nobody listens there.
    AccessDeniedError (PermissionError): errno EACCES, the socket's mode
    refuses you; EPERM, someone else owns or serves it."""

def default_socket_path() -> str:
    """The socket path connect() tries first when given None."""
