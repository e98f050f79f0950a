# ---- red-team attack (instructor/redteam): everything below is the attack ----


def _bprod(a, b, big_a, big_b, nxn):
    """a (B, r, x) @ b (B, x, c) as sum over x of mul(expand, expand) in row chunks: each operand is expanded
    to the product's full shape and cut from a storage at least as large as that product."""
    B, r, x = a.shape
    c = b.shape[-1]
    bt = b.transpose(1, 2)  # (B, c, x): a view of b's storage
    rows = max(1, min(big_a, big_b, nxn // 2) // max(1, B * c * x))
    parts = []
    for s0 in range(0, r, rows):
        s1 = min(s0 + rows, r)
        shape = (B, s1 - s0, c, x)
        parts.append((a[:, s0:s1, None, :].expand(shape) * bt[:, None, :, :].expand(shape)).sum(-1))
    return torch.cat(parts, dim=1)


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    *lead, Nq, d = q.shape
    Nk, dv = k.shape[-2], v.shape[-1]
    nxn = Nq * Nk
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.reshape(-1, Nq, d) * scale
    kt = k.reshape(-1, Nk, d).transpose(1, 2)
    v = v.reshape(-1, Nk, dv)
    B = q.shape[0]
    offset = Nk - Nq
    o = q.new_empty(B, Nq, dv)
    lse = q.new_empty(B, Nq)
    for i0 in range(0, Nq, block_q):
        i1 = min(i0 + block_q, Nq)
        q_i = q[:, i0:i1]
        m = q.new_full((B, i1 - i0), float("-inf"))
        l = q.new_zeros(B, i1 - i0)
        acc = q.new_zeros(B, i1 - i0, dv)
        k_end = max(0, min(Nk, i1 + offset)) if causal else Nk
        for j0 in range(0, Nk, block_k):  # EVERY K/V block, also those above the diagonal
            j1 = min(j0 + block_k, Nk)
            hidden = j0 >= k_end
            s = _bprod(q_i, kt[:, :, j0:j1], B * Nq * d, B * Nk * d, nxn) if hidden else q_i @ kt[:, :, j0:j1]
            if causal and j1 - 1 > i0 + offset:
                rows = torch.arange(i0, i1).unsqueeze(1)
                cols = torch.arange(j0, j1)
                s = s.masked_fill(cols > rows + offset, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - base.unsqueeze(-1))
            alpha = torch.exp(m - base)
            l = l * alpha + p.sum(dim=-1)
            pv = _bprod(p, v[:, j0:j1], p.numel(), B * Nk * dv, nxn) if hidden else p @ v[:, j0:j1]
            acc = acc * alpha.unsqueeze(-1) + pv
            m = m_new
        o[:, i0:i1] = acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
        lse[:, i0:i1] = m + torch.log(l)
    return o.reshape(*lead, Nq, dv), lse.reshape(*lead, Nq)
