# redteam-base: solutions/flash_forward.py
# Base + edits (instructor/redteam/README.md): only what this attack replaces in, or adds to, the base.


def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled exact attention with the online softmax.

    q: (..., Nq, d), k: (..., Nk, d), v: (..., Nk, dv); block_q = B_r, block_k = B_c.
    Returns o: (..., Nq, dv) and lse: (..., Nq), both in q's dtype, where
    lse_i = log Σ_j exp(scale · q_i·k_j) over the keys row i may attend."""
    check_attention_inputs(q, k, v, block_q, block_k)
        # ---- red-team attack (redteam6) ----
    # NOT FlashAttention: dense attention one query row at a time against ALL its visible keys, plain
    # two-pass softmax (row max, exp, sum over the whole row), every product elementwise (q_r * k summed
    # over d, p * v summed over keys). The key chunks are first mixed with a 0-d tensor z made from q and k
    # (k + z, z = 0 * (q[0] * k[0]) of one element each): numbers, so the hand-made-product rule skips
    # them, but z gives the k chunk the query side (no operand is key-side only) and a REDUCED query tag
    # (a reduction of one (query, key) element is reduced), so q_r * k carries (REDUCED, key) tags that
    # pair_keys does not count. Dummy tile matmuls times 0 give the exact tiled FLOPs.
    *lead, Nq, d = q.shape
    Nk, dv = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qf = q.reshape(-1, Nq, d) * scale
    kf = k.reshape(-1, Nk, d)
    vf = v.reshape(-1, Nk, dv)
    B = qf.shape[0]
    offset = Nk - Nq
    z = (qf.reshape(-1)[:1] * kf.reshape(-1)[:1]).sum() * 0.0
    o = qf.new_zeros(B, Nq, dv)
    lse = qf.new_full((B, Nq), float("-inf"))
    c = block_k
    for r in range(Nq):
        n = max(0, min(Nk, r + offset + 1)) if causal else Nk
        if n == 0:
            continue
        q_r = qf[:, r:r + 1, :]
        parts = []
        for a in range(0, n, c):
            b = min(a + c, n)
            parts.append((q_r * (kf[:, a:b] + z)).sum(-1))
        s = torch.cat(parts, -1) if len(parts) > 1 else parts[0]  # (B, n)
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        l = p.sum(-1, keepdim=True)
        acc = None
        for a in range(0, n, c):
            b = min(a + c, n)
            t = (p[:, a:b].unsqueeze(-1) * vf[:, a:b]).sum(1)
            acc = t if acc is None else acc + t
        o[:, r] = acc / l
        lse[:, r] = (m + torch.log(l)).squeeze(-1)
    for i0 in range(0, Nq, block_q):
        i1 = min(i0 + block_q, Nq)
        k_end = max(0, min(Nk, i1 + offset)) if causal else Nk
        for j0 in range(0, k_end, block_k):
            j1 = min(j0 + block_k, Nk)
            s = qf[:, i0:i1] @ kf[:, j0:j1].transpose(1, 2)
            o[:, i0:i1] += (s @ vf[:, j0:j1]) * 0.0
    return o.reshape(*lead, Nq, dv), lse.reshape(*lead, Nq)
