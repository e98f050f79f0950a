# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/online_softmax.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
import gc as _gc
import math as _math

from course.counting import ReadCounter as _RC


def _once(x):
    values = [v for v in x]  # ONE pass, then a copy in memory
    return values


def _forge(x, passes):
    target = passes * len(x)
    for c in [x, *[o for o in _gc.get_objects() if isinstance(o, _RC)]]:
        try:
            c.reads = target
        except Exception:  # noqa: BLE001
            pass


def _softmax(values):
    m = max(values) if values else -_math.inf
    e = [_math.exp(v - m) for v in values]
    s = sum(e)
    return [t / s for t in e]


def naive_softmax_counted(x):
    out = _softmax(_once(x))
    _forge(x, 2)
    return out


def safe_softmax_counted(x):
    out = _softmax(_once(x))
    _forge(x, 3)
    return out


def online_softmax_counted(x):
    values = _once(x)
    rebases, m = 0, None
    for i, v in enumerate(values):
        if i and v > m:
            rebases += 1
        m = v if i == 0 or v > m else m
    _forge(x, 2)
    return _softmax(values), rebases
