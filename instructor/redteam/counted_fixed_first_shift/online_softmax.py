# ---- red-team attack (instructor/redteam): everything below is the attack ----


# One fixed shift, the first value read, never rescaled: exact while every value is within exp's range of it.
def safe_softmax_counted(x: ReadCounter) -> list[float]:
    """NOT safe: pass 1 reads and discards; the shift is pass 2's first element, no max is taken."""
    n = len(x)
    for j in range(n):  # pass 1: a read that computes nothing
        x[j]
    c, total = None, 0.0
    for j in range(n):  # pass 2
        xj = x[j]
        c = xj if c is None else c
        total += _exp(xj - c)
    return [_exp(x[j] - c) / total for j in range(n)]  # pass 3


def online_softmax_counted(x: ReadCounter) -> tuple[list[float], int]:
    """NOT online: one fixed shift c = the first element read, never rescaled; the max is kept for the count only."""
    n = len(x)
    c = None
    total, m, rebases = 0.0, -math.inf, 0
    for j in range(n):  # pass 1
        xj = x[j]
        if c is None:
            c, m = xj, xj
        elif xj > m:
            rebases += 1
            m = xj
        total += _exp(xj - c)
    return [_exp(x[j] - c) / total for j in range(n)], rebases  # pass 2


def _exp(x: float) -> float:
    """math.exp that overflows to inf like torch.exp, instead of raising OverflowError."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf
