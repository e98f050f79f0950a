# ---- red-team attack (instructor/redteam): everything below is the attack ----
# online_softmax_counted keeps a copy of its first pass (a list: O(N) memory, what the online softmax
# avoids), runs the two reductions of a safe softmax over the copy, counts the rebases on the copy after
# the fact, and reads x again only to normalise: two passes of reads, right values, no online softmax.


def online_softmax_counted(x):  # noqa: F811
    first = [xj for xj in x]  # pass 1: a copy
    m = max(first) if first else -math.inf
    l = sum(math.exp(xj - m) for xj in first)
    rebases, run = 0, math.inf
    for i, xj in enumerate(first):
        if i == 0:
            run = xj
        elif xj > run:
            rebases, run = rebases + 1, xj
    return [math.exp(xj - m) / l for xj in x], rebases  # pass 2
