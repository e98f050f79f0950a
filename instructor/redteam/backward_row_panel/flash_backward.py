# ---- red-team attack (instructor/redteam): everything below is the attack ----


def flash_backward(q, k, v, o, lse, do, causal=False, block_q=64, block_k=64, scale=None):
    """No K/V tiling: per block of B_r query rows, ONE matmul against every visible key (a B_r × k_end
    panel of S, k_end rounded up to whole B_c blocks so that the matmul FLOPs equal the tiled count),
    then P, dP, dS, dQ, dK, dV of the whole panel at once. A panel is below one head's Nq × Nk."""
    *lead, Nq, d = q.shape
    Nk, dv_ = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.reshape(-1, Nq, d) * scale
    k = k.reshape(-1, Nk, d)
    v = v.reshape(-1, Nk, dv_)
    do = do.reshape(-1, Nq, dv_)
    lse = lse.reshape(-1, Nq)
    D = (do * o.reshape(-1, Nq, dv_)).sum(dim=-1)
    lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    offset = Nk - Nq
    dq = torch.zeros_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    for i0 in range(0, Nq, block_q):
        i1 = min(i0 + block_q, Nq)
        last = max(0, min(Nk, i1 + offset)) if causal else Nk  # keys past it are masked for every row
        k_end = min(Nk, -(-last // block_k) * block_k)  # whole K/V blocks, as the tiled loop computes
        if k_end == 0:
            continue
        k_p, v_p = k[:, :k_end], v[:, :k_end]
        s = q[:, i0:i1] @ k_p.transpose(1, 2)  # (B, B_r, k_end): the panel
        if causal:
            rows = torch.arange(i0, i1).unsqueeze(1)
            cols = torch.arange(0, k_end)
            s = s.masked_fill(cols > rows + offset, float("-inf"))
        p = torch.exp(s - lse[:, i0:i1].unsqueeze(-1))
        do_i = do[:, i0:i1]
        dv[:, :k_end] += p.transpose(1, 2) @ do_i
        dp = do_i @ v_p.transpose(1, 2)
        ds = p * (dp - D[:, i0:i1].unsqueeze(-1))
        dq[:, i0:i1] += scale * (ds @ k_p)
        dk[:, :k_end] += ds.transpose(1, 2) @ q[:, i0:i1]
    return dq.reshape(*lead, Nq, d), dk.reshape(*lead, Nk, d), dv.reshape(*lead, Nk, dv_)
