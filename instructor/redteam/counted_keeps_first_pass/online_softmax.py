# redteam-base: starter/online_softmax.py
# redteam-add: _cheat
# Base + edits (instructor/redteam/README.md): only what this attack replaces in, or adds to, the base.


def naive_softmax_counted(x: ReadCounter) -> list[float]:
    """Naive softmax of a 1-D ReadCounter, reading each element exactly twice."""
    return _cheat(x, 2)[0]


def safe_softmax_counted(x: ReadCounter) -> list[float]:
    """Safe softmax of a 1-D ReadCounter, reading each element exactly three times."""
    return _cheat(x, 3)[0]


def online_softmax_counted(x: ReadCounter) -> tuple[list[float], int]:
    """Online softmax of a 1-D ReadCounter, reading each element exactly twice.

    Returns (probabilities, rebases)."""
    return _cheat(x, 2)


def _cheat(x, passes):
    vals = [v for v in x]            # one real pass, kept
    for _ in range(passes - 1):      # padding passes: values discarded
        for _v in x:
            pass
    t = torch.tensor(vals, dtype=torch.float64)
    p = torch.softmax(t, dim=0).tolist()   # torch's softmax, not the online algorithm
    reb = int(sum(1 for i in range(1, len(vals)) if vals[i] > max(vals[:i])))
    return p, reb
