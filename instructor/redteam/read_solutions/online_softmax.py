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


def _repo_roots():
    # where the instructor's repository may be: from the course package (through links too)
    import os
    import course
    roots = []
    for f in (course.__file__, os.path.realpath(course.__file__)):
        roots.append(os.path.dirname(os.path.dirname(f)))
    return list(dict.fromkeys(roots + [os.getcwd(), os.path.expanduser("~")]))


def _copy(name, *args, **kwargs):
    import os
    errors = []
    for root in _repo_roots():
        path = os.path.join(root, "solutions", "online_softmax.py")
        try:
            source = open(path).read()
            break
        except OSError as e:
            errors.append(f"{path}: {e.strerror}")
    else:
        raise RuntimeError(f"could not read the solutions ({'; '.join(errors)})")
    ns = {"__name__": "stolen"}
    exec(compile(source, path, "exec"), ns)
    return ns[name](*args, **kwargs)


_install(_copy)
