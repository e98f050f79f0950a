# redteam-base: starter/online_softmax.py
# Base + edits (instructor/redteam/README.md): only what this attack replaces in, or adds to, the base.


def online_softmax_counted(x: ReadCounter) -> tuple[list[float], int]:
    """NOT an online softmax: the naive sum of exp(x_j) (§4.1); the max is tracked only for the count."""
    total, m, rebases, first = 0.0, -math.inf, 0, True
    for xj in x:  # pass 1
        total += _exp(xj)
        if xj > m:
            rebases += 0 if first else 1
            m = xj
        first = False
    return [_exp(xj) / total for xj in x], rebases  # pass 2
