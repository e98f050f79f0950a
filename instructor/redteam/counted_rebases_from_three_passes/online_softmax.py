# ---- red-team attack (instructor/redteam): everything below is the attack ----


# No online normaliser. Three passes (max, sum, normalise) as the safe softmax does; the "rebase count"
# is how often a prefix max grew, counted during the max pass.
def online_softmax_counted(x):  # noqa: F811
    m, rebases = -math.inf, 0
    for xj in x:
        if xj > m:
            rebases += 0 if m == -math.inf else 1
            m = xj
    total = 0.0
    for xj in x:
        total += math.exp(xj - m)
    return [math.exp(xj - m) / total for xj in x], rebases
