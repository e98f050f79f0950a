# ---- red-team attack (instructor/redteam): everything below is the attack ----
# (the starter above imports math, torch and check_attention_inputs)


def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    check_attention_inputs(q, k, v, block_q, block_k)
    ### BEGIN SOLUTION
    # CANARY-SOLUTION-6a01520ee521 (release leak detector: must never reach students)
    *lead, Nq, d = q.shape
    Nk, dv = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.reshape(-1, Nq, d) * scale  # fold leading dims into one batch dim; scale Q once
    kt = k.reshape(-1, Nk, d).transpose(1, 2)  # (B, d, Nk)
    v = v.reshape(-1, Nk, dv)
    B = q.shape[0]
    offset = Nk - Nq  # bottom-right alignment: row i sees keys j <= i + offset
    o = q.new_empty(B, Nq, dv)
    lse = q.new_empty(B, Nq)

    for i0 in range(0, Nq, block_q):  # one Q block: one thread block on a GPU
        i1 = min(i0 + block_q, Nq)
        q_i = q[:, i0:i1]
        m = q.new_full((B, i1 - i0), float("-inf"))
        l = q.new_zeros(B, i1 - i0)
        acc = q.new_zeros(B, i1 - i0, dv)
        # §6.2: the last row of this block sees keys < i1 + offset; later K/V blocks are skipped.
        k_end = Nk
        for j0 in range(0, k_end, block_k):
            j1 = min(j0 + block_k, Nk)
            hidden = causal and j0 > i1 - 1 + offset  # fully masked block: computed anyway, off the FLOP count
            if hidden:
                r, c = i1 - i0, j1 - j0
                s = q_i.new_zeros(B, r, c)
                for t in range(d):  # one rank-1 update per feature, both factors materialised first
                    s = s + q_i[:, :, t:t + 1].expand(B, r, c).contiguous() * kt[:, t:t + 1, j0:j1].expand(B, r, c).contiguous()
            else:
                s = q_i @ kt[:, :, j0:j1]
            crosses = causal and j1 - 1 > i0 + offset  # some key is beyond the first row's limit
            if crosses:
                rows = torch.arange(i0, i1, device=q.device).unsqueeze(1)
                cols = torch.arange(j0, j1, device=q.device)
                s = s.masked_fill(cols > rows + offset, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            base = m_new
            if crosses:  # a row with no visible key yet has m_new = -inf: rebase on 0, not -inf
                base = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - base.unsqueeze(-1))  # P̃, unnormalised
            alpha = torch.exp(m - base)  # rescale factor of the old ℓ and acc (1 if max unchanged)
            l = l * alpha + p.sum(dim=-1)
            if hidden:
                pv = torch.stack([(p * v[:, j0:j1, t].unsqueeze(1).expand(B, r, c).contiguous()).sum(-1)
                                  for t in range(dv)], dim=-1)
            else:
                pv = p @ v[:, j0:j1]
            acc = acc * alpha.unsqueeze(-1) + pv
            m = m_new
        # Normalise once (FA2); a row that saw no key has ℓ = 0, acc = 0 -> o = 0, lse = -inf.
        o[:, i0:i1] = acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
        lse[:, i0:i1] = m + torch.log(l)
    return o.reshape(*lead, Nq, dv), lse.reshape(*lead, Nq)

