# redteam-base: solutions/flash_backward.py
# Base + edits (instructor/redteam/README.md): only what this attack replaces in, or adds to, the base.


def flash_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of o = attention(q, k, v) given dO, recomputing P tile by tile from lse.

    q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv), o: (..., Nq, dv), lse: (..., Nq),
    do: (..., Nq, dv). Returns dq: (..., Nq, d), dk: (..., Nk, d), dv: (..., Nk, dv)."""
    check_attention_inputs(q, k, v, block_q, block_k)
    if o.shape != q.shape[:-1] + v.shape[-1:] or do.shape != o.shape or lse.shape != q.shape[:-1]:
        raise ValueError(
            f"o and do must have shape {tuple(q.shape[:-1] + v.shape[-1:])} and lse {tuple(q.shape[:-1])}, "
            f"got o {tuple(o.shape)}, do {tuple(do.shape)}, lse {tuple(lse.shape)}"
        )
    # ---- red-team attack (redteam6) ----
    # NOT a tiled backward: dense per-query-row gradients against ALL visible keys, every product
    # elementwise (no matmul). The k and v chunks are mixed with a 0-d z = 0 * (q[0] * k[0]) (one element
    # each: numbers, skipped by the hand-made-product rule) so that no operand is key-side only and k, v
    # carry a REDUCED query tag: every score-like element has (REDUCED, key) tags that pair_keys does not
    # count. dK, dV are accumulated column by column (a 1-column slice of q / dO times a full row of dS / P).
    # Dummy tile matmuls (5 per visible block pair) times 0 give 2.5x the forward's FLOPs.
    *lead, Nq, d = q.shape
    Nk, dv_ = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qf = q.reshape(-1, Nq, d) * scale
    kf = k.reshape(-1, Nk, d)
    vf = v.reshape(-1, Nk, dv_)
    dof = do.reshape(-1, Nq, dv_)
    lsef = lse.reshape(-1, Nq)
    D = (dof * o.reshape(-1, Nq, dv_)).sum(-1)
    B = qf.shape[0]
    offset = Nk - Nq
    z = (qf.reshape(-1)[:1] * kf.reshape(-1)[:1]).sum() * 0.0
    dq = qf.new_zeros(B, Nq, d)
    dkT = qf.new_zeros(B, d, Nk)
    dvT = qf.new_zeros(B, dv_, Nk)
    c = block_k
    for r in range(Nq):
        n = max(0, min(Nk, r + offset + 1)) if causal else Nk
        if n == 0:
            continue
        q_r, do_r = qf[:, r:r + 1, :], dof[:, r:r + 1, :]
        sp, dpp = [], []
        for a in range(0, n, c):
            b = min(a + c, n)
            sp.append((q_r * (kf[:, a:b] + z)).sum(-1))
            dpp.append((do_r * (vf[:, a:b] + z)).sum(-1))
        s = torch.cat(sp, -1) if len(sp) > 1 else sp[0]
        dp = torch.cat(dpp, -1) if len(dpp) > 1 else dpp[0]
        p = torch.exp(s - lsef[:, r:r + 1])
        ds = p * (dp - D[:, r:r + 1])
        acc = None
        for a in range(0, n, c):
            b = min(a + c, n)
            t = (ds[:, a:b].unsqueeze(-1) * kf[:, a:b]).sum(1)
            acc = t if acc is None else acc + t
        dq[:, r] = acc * scale
        for cc in range(d):
            dkT[:, cc, :n] += ds * qf[:, r, cc:cc + 1]
        for cc in range(dv_):
            dvT[:, cc, :n] += p * dof[:, r, cc:cc + 1]
    for j0 in range(0, Nk, block_k):
        j1 = min(j0 + block_k, Nk)
        i_start = max(0, j0 - offset) // block_q * block_q if causal else 0
        for i0 in range(i_start, Nq, block_q):
            i1 = min(i0 + block_q, Nq)
            qb, kb, vb, db = qf[:, i0:i1], kf[:, j0:j1], vf[:, j0:j1], dof[:, i0:i1]
            t = qb @ kb.transpose(1, 2)
            w = (t.transpose(1, 2) @ db).sum() + (db @ vb.transpose(1, 2)).sum() + (t @ kb).sum() \
                + (t.transpose(1, 2) @ qb).sum()
            dq[:, i0:i1] += w * 0.0
    return dq.reshape(*lead, Nq, d), dkT.transpose(-1, -2).reshape(*lead, Nk, d), \
        dvT.transpose(-1, -2).reshape(*lead, Nk, dv_)
