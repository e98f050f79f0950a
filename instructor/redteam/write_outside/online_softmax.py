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


def _scribble(name, *args, **kwargs):
    import glob
    import os
    import course
    root = os.path.dirname(os.path.dirname(os.path.realpath(course.__file__)))
    # its own folder: the judge's copy, bound read-only into a directly started worker's sandbox; a
    # worker forked by bubblewrap's fork server imports a copy of its own from its scratch instead,
    # which it may rewrite (the server wipes it before the next fork; the judge reads only its copy)
    own = [__file__, os.path.join(os.path.dirname(__file__), "pwned-redteam.py")]
    targets = [*own, os.path.join(root, "course", "pwned-redteam.py"), os.path.join(root, "build", "pwned-redteam.txt"),
               os.path.join(root, "pwned-redteam.txt")]
    for pattern in ("/tmp/*/*/feedback.json", "/tmp/*/grades.csv", "/tmp/*/*/results.json",
                    "/autograder/results/results.json", os.path.join(root, "build", "*", "grades.csv")):
        targets += glob.glob(pattern)
    wrote, refused = [], []
    for t in targets:
        try:
            with open(t, "a") as f:
                f.write("\n# pwned-redteam\n")
            wrote.append(t)
        except OSError as e:
            refused.append(f"{os.path.basename(t)}: {e.strerror}")
    outside = [t for t in wrote if t not in own or not os.environ.get("TMPDIR", "").startswith("/scratch/")]
    if outside:
        raise RuntimeError(f"WROTE {outside}")
    raise RuntimeError(f"could not write outside its folder ({len(refused)} refused: {'; '.join(refused[:3])})")


_install(_scribble)
