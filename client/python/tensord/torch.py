"""torch state dicts through tensord: weight sync from a trainer to rollouts.

    import torch, tensord, tensord.torch

    # The trainer, each step: one version of every parameter and buffer.
    commit = tensord.torch.put_state_dict(c, "policy/", model.state_dict(), replace=True)

    # A rollout: the model built without memory, then given the daemon's.
    with torch.device("meta"):
        model = Policy()
    last = tensord.torch.load_state_dict(c, "policy/", model)
    ...
    last = tensord.torch.load_state_dict(c, "policy/", model, after=last)  # the next one

put_state_dict() puts prefix + key for every entry, detached, in one
put_many: one commit. load_state_dict() attaches the whole prefix in one
daemon step (never a mix of two versions), checks its keys, shapes and
dtypes against the model's own state dict (errors name every key that
differs), and makes the attached tensors the model's parameters and
buffers, zero copy (model.load_state_dict(..., assign=True), so a model
built on the meta device works). That memory is shared and read-only (an
immutable tensor's pages are mapped copy-on-write: a write would land in a
private copy of this process and never reach the others), so the loaded
parameters have requires_grad=False and an optimizer never steps them.
trainable=True copies instead: into the model's own memory for an
ordinary model (its Parameters stay the same objects), into private
clones for a meta one; then the parameters are trainable as usual.

The loaded tensors hold the version's lease: its bytes stay while the
model (or anything else) references them, also after the trainer replaces
it; loading the next version lets the old one go. A model's tied weights
(one Parameter under two keys) are put twice and loaded untied.

The torch-free part (numpy, JAX) is tensord.state_dict.
"""
from typing import Any, Mapping

import torch

from . import state_dict as _sd
from .state_dict import StateDict

__all__ = ["StateDict", "attach_state_dict", "load_state_dict", "put_state_dict"]


def put_state_dict(client: Any, prefix: str, state_dict: Mapping[str, Any],
                   **put_many_options: Any) -> int:
    """Puts every tensor of state_dict (a module's state_dict(), or any
    mapping key -> tensor) as prefix + key, detached, in one commit
    (client.put_many(..., **put_many_options); replace=True for each next
    version); returns the commit id. An entry that is not a tensor (a
    module's extra state, say) is refused with a TypeError naming its key,
    a meta tensor with a ValueError naming it, and so are a prefix without
    a trailing '/' and an empty dict (ValueError)."""
    what = "tensord.torch.put_state_dict"
    tensors = {}
    for key, value in state_dict.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError("%s: entry %r is a %s, not a torch.Tensor; only tensors are "
                            "put (drop it from the dict first)" %
                            (what, key, type(value).__name__))
        if value.is_meta:
            raise ValueError("%s: entry %r is on the meta device: it has no data to put "
                             "(load the model's weights first)" % (what, key))
        tensors[key] = value.detach()
    return client.put_many(_sd.names_of(prefix, tensors, what), **put_many_options)


def attach_state_dict(client: Any, prefix: str, *, after: int | None = None,
                      timeout: float | None = None) -> StateDict:
    """key (prefix stripped) -> torch tensor over the daemon's memory, zero
    copy, every name under prefix leased in one daemon step; .commit is
    the commit they come from. after: a commit id, waits for a newer one
    (as Client.attach_many; timeout likewise). The tensors of immutable
    names are read-only memory that torch does not know is: do not write
    them (a write stays in this process). Each holds its lease until
    collected."""
    return _sd.attach_state_dict(client, prefix, after=after, timeout=timeout,
                                 from_dlpack=torch.from_dlpack)


def _describe(t: torch.Tensor) -> str:
    return "%s%s" % (str(t.dtype).replace("torch.", ""), list(t.shape))


def _keys(keys: list[str], most: int = 10) -> str:
    """The first `most` keys, and how many more."""
    shown = ", ".join(repr(k) for k in keys[:most])
    return shown + (" and %d more" % (len(keys) - most) if len(keys) > most else "")


def load_state_dict(client: Any, prefix: str, model: torch.nn.Module, *,
                    after: int | None = None, strict: bool = True, trainable: bool = False,
                    timeout: float | None = None) -> int:
    """Loads the version under prefix into model; returns its commit id.

    Keys are the names under prefix with it stripped. strict=True: a key
    the model has and the set lacks (missing) or the other way round
    (unexpected) is a ValueError naming them all; strict=False skips them
    (missing ones keep what the model had, meta tensors included). A shape
    or dtype that differs is always a ValueError naming the key, both
    shapes and dtypes. after, timeout: as attach_state_dict (after=commit
    waits for the next version).

    trainable=False (default): the model's parameters and buffers become
    the attached tensors (assign=True: a model on the meta device works),
    zero copy, and its parameters get requires_grad=False: that memory is
    read-only. A tensor the model holds on another device than the stored
    one is copied to the model's device. trainable=True: an ordinary model
    gets the values copied into its own tensors (its Parameter objects and
    requires_grad stay); a model with meta tensors gets private clones,
    trainable Parameters."""
    sd = attach_state_dict(client, prefix, after=after, timeout=timeout)
    own = {k: v for k, v in model.state_dict(keep_vars=True).items()
           if isinstance(v, torch.Tensor)}
    what = "tensord.torch.load_state_dict(prefix %r, commit %d)" % (prefix, sd.commit)
    missing = [k for k in own if k not in sd]
    unexpected = [k for k in sd if k not in own]
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append("missing keys (in the model, not under the prefix): " + _keys(missing))
        if unexpected:
            parts.append("unexpected keys (under the prefix, not in the model): " +
                         _keys(unexpected))
        raise ValueError("%s: %s" % (what, "; ".join(parts)))
    differ = ["%r: stored %s, model %s" % (k, _describe(sd[k]), _describe(own[k]))
              for k in own if k in sd and
              (sd[k].shape != own[k].shape or sd[k].dtype != own[k].dtype)]
    if differ:
        raise ValueError("%s: shape or dtype differs for %s" % (what, "; ".join(differ)))
    load = {k: sd[k] for k in own if k in sd}
    on_meta = any(t.is_meta for t in own.values())
    if trainable and not on_meta:
        model.load_state_dict(load, strict=strict)          # copies into the model's memory
        return sd.commit
    for k, v in load.items():
        target = own[k].device
        if not own[k].is_meta and target != v.device:
            load[k] = v.to(target)                          # a private copy on that device
        elif trainable:
            load[k] = v.clone()                             # private, writable memory
    model.load_state_dict(load, strict=strict, assign=True)
    if not trainable:
        for name, p in model.named_parameters(remove_duplicate=False):
            if name in load:
                p.requires_grad_(False)
    return sd.commit
