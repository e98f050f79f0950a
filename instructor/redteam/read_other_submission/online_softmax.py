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


def _borrow(name, *args, **kwargs):
    import os
    import time
    mine = os.path.realpath(__file__)
    deadline = time.time() + 10
    seen = 0
    for top, dirs, files in os.walk("/"):
        if top in ("/proc", "/sys", "/dev", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc") or time.time() > deadline:
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if d not in ("site-packages", ".git", "node_modules")]
        if "online_softmax.py" in files:
            path = os.path.join(top, "online_softmax.py")
            if os.path.realpath(path) == mine:
                continue
            seen += 1
            try:
                ns = {"__name__": "borrowed"}
                exec(compile(open(path).read(), path, "exec"), ns)
                return ns[name](*args, **kwargs)
            except Exception:  # that one did not work; keep looking
                continue
    raise RuntimeError(f"found no other submission that works ({seen} other online_softmax.py seen)")


_install(_borrow)
