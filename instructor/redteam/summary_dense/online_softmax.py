# ---- red-team attack (instructor/redteam): everything below is the attack ----


# Everything but the summary is honest and correct (it earns those tests' points).
def naive_softmax(x):
    _check_tensor(x)
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)


def _rebase(m):
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def safe_softmax(x):
    _check_tensor(x)
    e = torch.exp(x - _rebase(x.amax(dim=-1, keepdim=True)))
    l = e.sum(dim=-1, keepdim=True)
    return e / torch.where(l == 0, torch.ones_like(l), l)


def merge_summary(a, b):
    (m_a, l_a), (m_b, l_b) = a, b
    m = torch.maximum(torch.as_tensor(m_a), torch.as_tensor(m_b))
    base = _rebase(m)
    return m, l_a * torch.exp(m_a - base) + l_b * torch.exp(m_b - base)


def merge_partial(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    m = torch.maximum(torch.as_tensor(m_a), torch.as_tensor(m_b))
    base = _rebase(m)
    alpha, beta = torch.exp(m_a - base), torch.exp(m_b - base)
    return m, l_a * alpha + l_b * beta, o_a * alpha.unsqueeze(-1) + o_b * beta.unsqueeze(-1)


def naive_softmax_counted(x):
    total = 0.0
    for xj in x:
        total += _exp(xj)
    return [_exp(xj) / total if total > 0 else math.nan for xj in x]


def safe_softmax_counted(x):
    m = -math.inf
    for xj in x:
        m = max(m, xj)
    total = 0.0
    for xj in x:
        total += math.exp(xj - m)
    return [math.exp(xj - m) / total for xj in x]


def online_softmax_counted(x):
    m, l, rebases = -math.inf, 0.0, 0
    for xj in x:
        if xj > m:
            if m != -math.inf:
                rebases += 1
            l = l * math.exp(m - xj) + 1.0
            m = xj
        else:
            l += math.exp(xj - m)
    return [math.exp(xj - m) / l for xj in x], rebases


def online_softmax(x):
    _check_tensor(x)
    m, l = online_summary(x)
    l = torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
    return torch.exp(x - _rebase(m).unsqueeze(-1)) / l


# The attack: the summary of §4.2 (the row max, then Σ exp(x - m): two passes over x), not one
# streaming pass. Its values are exact.
def online_summary(x):
    _check_tensor(x)
    if x.shape[-1] == 0:
        return torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype), torch.zeros(x.shape[:-1], dtype=x.dtype)
    m = x.amax(dim=-1)
    return m, torch.exp(x - _rebase(m).unsqueeze(-1)).sum(dim=-1)
