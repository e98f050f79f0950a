"""The judge's trusted references, remembered across the grades of one judge process.

A batch judge grades the same cases, on the same inputs (every case draws them from its own seed), for
every submission: the float64 attention of those inputs and its autograd gradients were computed again
for each one (about a tenth of the judge's time on parts 2, 4 and 6). `remembered(fn)` keeps fn's results
by the exact bits of its arguments, so each is computed once per process. Sound because fn is a pure
function of its arguments (the references here are); the key holds every tensor's dtype, shape and raw
bytes and every other argument's repr, and callers get fresh copies, so no caller can change what the
next one gets. A call with a tensor that requires grad (autograd through a reference) is not remembered.
"""
from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from typing import Any, Callable

import torch

import course.reference as _ref

TOTAL_BYTES = 256 << 20  # the remembered results' tensors; the least recently used go first

_store: OrderedDict[bytes, tuple[Any, int]] = OrderedDict()
_size = 0


def _key(name: str, args: tuple, kwargs: dict) -> bytes | None:
    """A digest of the call, or None when it must not be remembered (a tensor that requires grad, or
    an argument that is neither a tensor nor a plain value)."""
    h = hashlib.blake2b(name.encode(), digest_size=20)
    for a in (*args, *(x for item in sorted(kwargs.items()) for x in item)):
        if isinstance(a, torch.Tensor):
            if a.requires_grad or a.device.type != "cpu":
                return None
            t = a.detach().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # the bits: -0.0 and NaNs as given
        elif a is None or type(a) in (bool, int, float, str):
            h.update(f"P{type(a).__name__}:{a!r}".encode())
        else:
            return None
    if kwargs:
        h.update(f"K{len(args)}".encode())  # where the keywords start: f(a, b=x) is not f(a, x, "b")
    return h.digest()


def _copy(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if type(x) in (tuple, list):
        return type(x)(_copy(i) for i in x)
    if type(x) is dict:
        return {k: _copy(v) for k, v in x.items()}
    return x


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if type(x) in (tuple, list):
        return sum(_nbytes(i) for i in x)
    if type(x) is dict:
        return sum(_nbytes(i) for i in x.values())
    return 0


def remembered(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn (arguments: tensors and plain values; result: tensors and plain values in tuples, lists and
    dicts), computed once per distinct call in this process."""
    name = f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _size
        key = _key(name, args, kwargs)
        if key is None:
            return fn(*args, **kwargs)
        hit = _store.get(key)
        if hit is not None:
            _store.move_to_end(key)
            return _copy(hit[0])
        result = fn(*args, **kwargs)
        kept, n = _copy(result), _nbytes(result)
        if n <= TOTAL_BYTES // 16:
            _store[key] = (kept, n)
            _size += n
            while _size > TOTAL_BYTES:
                _, (_, m) = _store.popitem(last=False)
                _size -= m
        return result

    return wrapper


def forget() -> None:
    """Drop every remembered result (tests of this module)."""
    global _size
    _store.clear()
    _size = 0


attention_reference = remembered(_ref.attention_reference)
attention_plain = remembered(_ref.attention_plain)


@remembered
def reference_grads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, causal: bool,
                    scale: float | None, dtype_name: str = "float64") -> list[torch.Tensor]:
    """Autograd gradients (dq, dk, dv) of the reference attention in `dtype_name` (float64: attention_reference;
    another: attention_plain in that dtype) for the upstream gradient do."""
    dtype = getattr(torch, dtype_name)
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
    fn = _ref.attention_reference if dtype == torch.float64 else _ref.attention_plain
    o, _ = fn(*leaves, causal, scale)
    return list(torch.autograd.grad(o, leaves, do.to(dtype)))
