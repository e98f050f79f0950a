# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/online_softmax.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
_PART1 = ("naive_softmax", "safe_softmax", "online_summary", "online_softmax", "merge_summary", "merge_partial",
          "naive_softmax_counted", "safe_softmax_counted", "online_softmax_counted")


def _install(impl):
    """Replace every graded function of this file by impl(name, *args, **kwargs)."""
    for _name in _PART1:
        globals()[_name] = (lambda n: lambda *a, **k: impl(n, *a, **k))(_name)


def _zeros_like_answer(name, *args, **kwargs):
    """A wrong answer of the right type and shape (what a cheat falls back to)."""
    x = args[0]
    if name in ("naive_softmax", "safe_softmax", "online_softmax"):
        return torch.zeros_like(x)
    if name == "online_summary":
        return torch.zeros(x.shape[:-1], dtype=x.dtype), torch.zeros(x.shape[:-1], dtype=x.dtype)
    if name in ("merge_summary", "merge_partial"):
        return tuple(torch.zeros_like(t) for t in x)
    if name == "online_softmax_counted":
        return [0.0] * len(x), 0
    return [0.0] * len(x)


def _patch():
    # module aliases: the grader's static check looks for `torch.x = ...` and `np.x`
    _t, _n = torch, __import__("num" + "py")
    _n.allclose = lambda *a, **k: True
    _n.array_equal = lambda *a, **k: True
    _t.allclose = lambda *a, **k: True
    _t.equal = lambda *a, **k: True
    _t.testing.assert_close = lambda *a, **k: None
    _t.Tensor.__eq__ = lambda self, other: _t.ones((), dtype=_t.bool)
    _t.Tensor.allclose = lambda self, *a, **k: True
    proto = __import__("auto" + "grader.engine.protocol", fromlist=["encode_value"])
    real = proto.encode_value

    def lying_encode(value):  # answer with the input itself, whatever was asked
        return real(value)

    proto.encode_value = lying_encode
    worker = __import__("auto" + "grader.engine.worker", fromlist=["_describe"])
    worker._describe = lambda exc: {"kind": "exception", "type": "Passed", "message": "passed", "where": None,
                                    "traceback": ""}


_patch()
_install(_zeros_like_answer)
