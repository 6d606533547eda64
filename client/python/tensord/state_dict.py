"""State dicts as sets of tensors, for any array library (no torch needed).

    import numpy as np, tensord
    from tensord.state_dict import put_state_dict, attach_state_dict

    with tensord.connect() as c:
        commit = put_state_dict(c, "w/", {"a": np.ones(4), "b": np.zeros((2, 2))},
                                replace=True)
        sd = attach_state_dict(c, "w/")        # {"a": ..., "b": ...}, zero copy
        assert sd.commit == commit

put_state_dict() writes every entry of a mapping key -> array as the name
prefix + key, all in one put_many (one version, one commit id). An array
is anything put() takes: numpy, JAX, CuPy and torch arrays (a torch tensor
that requires grad is detached: the put copies anyway), buffers.

attach_state_dict() attaches every name under the prefix in one daemon
step (attach_many), so all of it is from one commit and never a mix of a
commit and its predecessor, and returns a StateDict (a dict with .commit)
of key (prefix stripped) -> array, made by from_dlpack (numpy.from_dlpack
unless told, with ml_dtypes' types for bfloat16 and float8 when ml_dtypes
is installed; jax.dlpack.from_dlpack or torch.from_dlpack work too; see
tensord.torch for torch). The arrays are zero-copy views of the daemon's
memory, read-only for immutable tensors, and each holds its share of the
tensor's lease: the version's bytes live while any array from it does,
also after the next version replaces it.

A prefix must end with '/': "w/" names "w/a", where "w" would also take
"w2/a" and "wa" on attach, and make "wa" of key "a" on put.
"""
from typing import Any, Callable, Mapping

__all__ = ["StateDict", "attach_state_dict", "put_state_dict"]


class StateDict(dict):
    """A dict key -> array from one set of tensors; .commit is the newest
    commit id among them (put_state_dict() writes them all in one, so all
    share it), 0 for an empty set."""

    commit: int = 0


def check_prefix(prefix: str, what: str) -> None:
    """Refuses a prefix that is not a str ending with '/' (ValueError, TypeError)."""
    if not isinstance(prefix, str):
        raise TypeError("%s: prefix must be a str ending with '/', not %s" %
                        (what, type(prefix).__name__))
    if not prefix.endswith("/"):
        raise ValueError("%s: prefix %r must end with '/' (the names are prefix + key: "
                         "%r would make %r of key 'weight'; use %r)" %
                         (what, prefix, prefix, prefix + "weight", prefix + "/"))


def _is_array(value: Any) -> bool:
    """Whether put() can read value: a DLPack producer or a buffer."""
    if hasattr(value, "__dlpack__") or type(value).__name__ == "PyCapsule":
        return True
    try:
        memoryview(value).release()
        return True
    except TypeError:
        return False


def names_of(prefix: str, state_dict: Mapping[str, Any], what: str) -> dict[str, Any]:
    """{prefix + key: value}, refusing keys that are not str and values that
    are not arrays (TypeError naming the key)."""
    check_prefix(prefix, what)
    out = {}
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise TypeError("%s: key %r is a %s; state dict keys must be str" %
                            (what, key, type(key).__name__))
        if not _is_array(value):
            raise TypeError("%s: entry %r is a %s, not an array or tensor; only arrays "
                            "are put (drop or convert it first)" %
                            (what, key, type(value).__name__))
        out[prefix + key] = value
    if not out:
        raise ValueError("%s: the state dict for prefix %r is empty" % (what, prefix))
    return out


def _numpy(t: Any) -> Any:
    """Tensor.__array__(): numpy.from_dlpack(t), or for the dtypes numpy's
    DLPack lacks (bfloat16, float8) a zero-copy ml_dtypes view."""
    return t.__array__()


def put_state_dict(client: Any, prefix: str, state_dict: Mapping[str, Any],
                   **put_many_options: Any) -> int:
    """Puts every key -> array of state_dict as prefix + key in one commit
    (client.put_many(..., **put_many_options): replace=True for the next
    version of the same names); returns the commit id. Non-array entries
    are refused (TypeError naming the key), as are a prefix without a
    trailing '/' and an empty state dict (ValueError)."""
    return client.put_many(names_of(prefix, state_dict, "put_state_dict"), **put_many_options)


def attach_state_dict(client: Any, prefix: str, *, after: int | None = None,
                      timeout: float | None = None,
                      from_dlpack: Callable[[Any], Any] | None = None) -> StateDict:
    """The arrays under prefix, key (prefix stripped) -> from_dlpack(tensor),
    zero copy, all leased in one daemon step; .commit says which commit.
    after and timeout as for Client.attach_many (after: a commit id; waits
    for a newer one). from_dlpack defaults to numpy.from_dlpack (bfloat16
    and float8 as ml_dtypes arrays, when it is installed). Each array
    holds its tensor's lease until it is collected; the Tensor objects are
    released before returning."""
    check_prefix(prefix, "attach_state_dict")
    if from_dlpack is None:
        from_dlpack = _numpy
    tensors = client.attach_many(prefix, after=after, timeout=timeout)
    out = StateDict()
    try:
        for name, t in tensors.items():
            out[name[len(prefix):]] = from_dlpack(t)
            out.commit = max(out.commit, t.commit)
    finally:
        for t in tensors.values():
            t.release()
    return out
