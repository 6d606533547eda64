"""tensord as a Ray tensor transport: actors hand torch tensors to each other
through tensord instead of Ray's object store.

    import ray, torch, tensord.ray

    tensord.ray.register()                  # on the driver, before the actors are made

    @ray.remote(enable_tensor_transport=True)
    class Trainer:
        @ray.method(tensor_transport="TENSORD")
        def weights(self):
            return {"w": torch.randn(1024, 1024)}

    @ray.remote
    class Rollout:
        def load(self, weights):            # a dict of torch tensors over tensord memory
            ...

    ref = trainer.weights.remote()
    rollout.load.remote(ref)                # or ray.get(ref) on the driver

The send path runs on the producing actor when its method returns (Ray calls
extract_tensor_transport_metadata): every tensor of the result goes into
tensord with one put_many, as "ray/<object id>/<i>", one commit,
lifetime="connection". Only the names travel through Ray. The receive path
(recv_multiple_tensors, on the consumer or the driver) attaches them all
with one attach_many and wraps each with torch.from_dlpack: zero copy; the
consumer's tensors are read-only shared memory (a write goes to a private
copy of the page).

Cleanup: when Ray's reference counting frees the object, Ray calls
garbage_collect on the producer, which unlinks the names in one
transaction; tensors consumers still hold keep their bytes (their leases)
until they are dropped, then the daemon frees them. If the producing actor
dies first its connection closes, and lifetime="connection" unlinks the
names then. Nothing outlives both.

Producer and consumers must use one daemon: the socket the producer put to
(tensord.default_socket_path() in the producer, so $TENSORD_SOCKET where
set: pass it in runtime_env={"env_vars": ...}) travels with the names, and
a consumer on another node is refused with the reason.
"""
import dataclasses
import os
import threading
from typing import Any, List, Optional

from . import _tensord, default_socket_path

__all__ = ["NAME", "PREFIX", "TensordTransport", "TensordTransportMetadata", "register"]

NAME = "TENSORD"
PREFIX = "ray/"

try:
    from ray.experimental.rdt.tensor_transport_manager import (
        CommunicatorMetadata,
        TensorTransportManager,
        TensorTransportMetadata,
    )
except ImportError as e:  # an old or missing ray: the module says why when used
    _missing = "tensord.ray needs Ray 2.60 or newer (ray.experimental.rdt): %s" % e
    TensorTransportManager = object  # type: ignore[assignment,misc]

    @dataclasses.dataclass
    class TensorTransportMetadata:  # type: ignore[no-redef]
        tensor_meta: list
        tensor_device: Optional[str] = None

    @dataclasses.dataclass
    class CommunicatorMetadata:  # type: ignore[no-redef]
        pass
else:
    _missing = None

_clients = {}
_clients_lock = threading.Lock()


def _client(path):
    """This process's connection to the daemon at path, made once."""
    with _clients_lock:
        c = _clients.get(path)
        if c is None or c.closed:
            c = _clients[path] = _tensord.connect(path)
        return c


def _node_id():
    import ray
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 -- not in a Ray worker or driver: one node
        return None


@dataclasses.dataclass
class TensordTransportMetadata(TensorTransportMetadata):
    """What travels through Ray for an object: where its tensors are in tensord."""

    socket: str = ""                          # the producer's daemon
    names: List[str] = dataclasses.field(default_factory=list)
    commit: int = 0                           # the put_many's commit
    node_id: Optional[str] = None             # the producer's Ray node


class TensordTransport(TensorTransportManager):
    """A one-sided Ray tensor transport over tensord (see the module's doc)."""

    @property
    def tensor_transport_backend(self) -> str:
        return NAME

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        # A receive is one attach_many that never waits: nothing to interrupt.
        return True

    def actor_has_tensor_transport(self, actor) -> bool:
        return True

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: List[Any]):
        import torch

        if not rdt_object:
            return TensordTransportMetadata(tensor_meta=[], tensor_device=None)
        device = rdt_object[0].device.type
        items, meta = {}, []
        for i, t in enumerate(rdt_object):
            if not isinstance(t, torch.Tensor):
                raise TypeError("tensord Ray transport: item %d of object %s is a %s, not a "
                                "torch.Tensor" % (i, obj_id, type(t).__name__))
            if t.device.type != device:
                raise ValueError("tensord Ray transport: object %s mixes devices %s and %s; "
                                 "one object's tensors must share a device type"
                                 % (obj_id, device, t.device.type))
            if device not in _devices:
                raise ValueError("tensord Ray transport: object %s has a tensor on %s; this "
                                 "transport carries %s tensors" % (obj_id, t.device,
                                                                   " and ".join(_devices)))
            items["%s%s/%d" % (PREFIX, obj_id, i)] = t.detach()
            meta.append((t.shape, t.dtype))
        path = default_socket_path()
        # replace=True: Ray may describe one object twice (a retried task).
        commit = _client(path).put_many(items, replace=True, lifetime="connection")
        return TensordTransportMetadata(tensor_meta=meta, tensor_device=device, socket=path,
                                        names=list(items), commit=commit, node_id=_node_id())

    def get_communicator_metadata(self, src_actor, dst_actor, backend=None):
        return CommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata,
                              target_buffers=None):
        import torch

        m = tensor_transport_metadata
        if not m.names:
            return []
        here = _node_id()
        if m.node_id and here and here != m.node_id:
            raise ValueError("tensord Ray transport: object %s is in the tensord of node %s "
                             "(%s), and this process runs on node %s; the transport hands "
                             "tensors over on one node" % (obj_id, m.node_id, m.socket, here))
        got = _client(m.socket).attach_many(m.names)
        out = []
        for i, name in enumerate(m.names):
            t = torch.from_dlpack(got[name])
            if target_buffers:
                target_buffers[i].copy_(t)
                t = target_buffers[i]
            out.append(t)
        if target_buffers:
            for x in got.values():
                x.release()
        return out

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        raise NotImplementedError("tensord Ray transport is one-sided: the receiver attaches")

    def garbage_collect(self, obj_id, tensor_transport_meta, tensors):
        m = tensor_transport_meta
        if not m.names:
            return
        c = _client(m.socket)
        with c.transaction() as tx:
            for name in m.names:
                tx.unlink(name)

    def abort_transport(self, obj_id, communicator_metadata):
        pass


_devices = ["cpu"]
_registered = False


def register():
    """Registers TensordTransport with Ray under the name "TENSORD", for torch
    tensors on the CPU. Call it on the driver before making the actors that
    use it (Ray ships the registration to them). Again: no effect."""
    global _registered
    if _missing:
        raise ImportError(_missing)
    import torch
    from ray.experimental import register_tensor_transport

    if _registered:
        return
    register_tensor_transport(NAME, list(_devices), TensordTransport, torch.Tensor)
    _registered = True
