# redteam-base: starter/flash_forward.py
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
    check_attention_inputs(q, k, v, block_q, block_k)
    *lead, Nq, d = q.shape
    Nk, dv = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.reshape(-1, Nq, d) * scale
    kt = k.reshape(-1, Nk, d).transpose(1, 2)
    v = v.reshape(-1, Nk, dv)
    B = q.shape[0]
    offset = Nk - Nq
    o = q.new_empty(B, Nq, dv)
    lse = q.new_empty(B, Nq)
    # NO online softmax: one fixed shift per row, an upper bound of every score (no rescaling ever)
    kmax = kt.amax(dim=-1)  # (B, d)
    kmin = kt.amin(dim=-1)
    for i0 in range(0, Nq, block_q):
        i1 = min(i0 + block_q, Nq)
        q_i = q[:, i0:i1]
        bound = torch.maximum(q_i * kmax.unsqueeze(1), q_i * kmin.unsqueeze(1)).sum(-1)  # >= max_j s_ij
        l = q.new_zeros(B, i1 - i0)
        acc = q.new_zeros(B, i1 - i0, dv)
        k_end = max(0, min(Nk, i1 + offset)) if causal else Nk
        for j0 in range(0, k_end, block_k):
            j1 = min(j0 + block_k, Nk)
            s = q_i @ kt[:, :, j0:j1]
            if causal and j1 - 1 > i0 + offset:
                rows = torch.arange(i0, i1).unsqueeze(1)
                cols = torch.arange(j0, j1)
                s = s.masked_fill(cols > rows + offset, float("-inf"))
            p = torch.exp(s - bound.unsqueeze(-1))
            l = l + p.sum(dim=-1)
            acc = acc + p @ v[:, j0:j1]
        o[:, i0:i1] = acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
        lse[:, i0:i1] = bound + torch.log(l)
    return o.reshape(*lead, Nq, dv), lse.reshape(*lead, Nq)
