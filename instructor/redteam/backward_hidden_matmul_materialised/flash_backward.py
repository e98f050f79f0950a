# ---- red-team attack (instructor/redteam): everything below is the attack ----
# (the starter above imports math, torch and check_attention_inputs)


def _hmm(a, b):
    B, r, n = a.shape
    c = b.shape[-1]
    out = a.new_zeros(B, r, c)
    for t in range(n):
        out = out + a[:, :, t:t + 1].expand(B, r, c).contiguous() * b[:, t:t + 1, :].expand(B, r, c).contiguous()
    return out



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
    check_attention_inputs(q, k, v, block_q, block_k)
    if o.shape != q.shape[:-1] + v.shape[-1:] or do.shape != o.shape or lse.shape != q.shape[:-1]:
        raise ValueError(
            f"o and do must have shape {tuple(q.shape[:-1] + v.shape[-1:])} and lse {tuple(q.shape[:-1])}, "
            f"got o {tuple(o.shape)}, do {tuple(do.shape)}, lse {tuple(lse.shape)}"
        )
    ### BEGIN SOLUTION
    # CANARY-SOLUTION-13eb915a5abe (release leak detector: must never reach students)
    *lead, Nq, d = q.shape
    Nk, dv_ = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.reshape(-1, Nq, d) * scale  # scaled Q: S = q kᵀ, and dK = dSᵀ q already carries the scale
    k = k.reshape(-1, Nk, d)
    v = v.reshape(-1, Nk, dv_)
    do = do.reshape(-1, Nq, dv_)
    lse = lse.reshape(-1, Nq)
    D = (do * o.reshape(-1, Nq, dv_)).sum(dim=-1)  # §7.3, (B, Nq)
    lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)  # masked rows: P = exp(-inf) = 0
    B = q.shape[0]
    offset = Nk - Nq  # bottom-right alignment, as in the forward
    dq = torch.zeros_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)

    for j0 in range(0, Nk, block_k):  # one K/V block: one thread block on a GPU
        j1 = min(j0 + block_k, Nk)
        k_j, v_j = k[:, j0:j1], v[:, j0:j1]
        dk_j = k.new_zeros(B, j1 - j0, d)
        dv_j = v.new_zeros(B, j1 - j0, dv_)
        # §6.2: Q rows i < j0 - offset see no key of this block; skip whole Q blocks before that.
        i_start = 0
        for i0 in range(i_start, Nq, block_q):
            i1 = min(i0 + block_q, Nq)
            mm = _hmm if (causal and i1 - 1 + offset < j0) else torch.matmul  # masked tile: off the count
            s = mm(q[:, i0:i1], k_j.transpose(1, 2))
            if causal and j1 - 1 > i0 + offset:  # the tile crosses the diagonal
                rows = torch.arange(i0, i1, device=q.device).unsqueeze(1)
                cols = torch.arange(j0, j1, device=q.device)
                s = s.masked_fill(cols > rows + offset, float("-inf"))
            p = torch.exp(s - lse[:, i0:i1].unsqueeze(-1))  # normalised P, straight from lse
            do_i = do[:, i0:i1]
            dv_j += mm(p.transpose(1, 2), do_i)
            dp = mm(do_i, v_j.transpose(1, 2))
            ds = p * (dp - D[:, i0:i1].unsqueeze(-1))
            dq[:, i0:i1] += scale * mm(ds, k_j)  # the "atomic add" of §7.4
            dk_j += mm(ds.transpose(1, 2), q[:, i0:i1])
        dk[:, j0:j1] = dk_j
        dv[:, j0:j1] = dv_j
    return dq.reshape(*lead, Nq, d), dk.reshape(*lead, Nk, d), dv.reshape(*lead, Nk, dv_)

