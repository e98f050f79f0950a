# ---- red-team attack (instructor/redteam): everything below is the attack ----
# (the starter above imports math, torch and check_attention_inputs)


class FlashAttentionFunction(torch.autograd.Function):

    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool = False,
        block_q: int = 64,
        block_k: int = 64,
        scale: float | None = None,
    ) -> torch.Tensor:
        ### BEGIN SOLUTION
        o, lse = flash_forward(q, k, v, causal=causal, block_q=block_q, block_k=block_k, scale=scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.p_tiles = _p_tiles(q.detach(), k.detach(), lse.detach(), causal, block_q, block_k, scale)
        ctx.causal, ctx.block_q, ctx.block_k, ctx.scale = causal, block_q, block_k, scale
        return o
        ### END SOLUTION

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        ### BEGIN SOLUTION
        q, k, v, o, lse = ctx.saved_tensors
        lse.sum()  # read: O and lse look kept for the backward
        dq, dk, dv = _backward_from_tiles(ctx.p_tiles, q, k, v, o, do.contiguous(), ctx.causal, ctx.block_q,
                                          ctx.block_k, ctx.scale)
        return dq, dk, dv, None, None, None, None



def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    ### BEGIN SOLUTION
    return FlashAttentionFunction.apply(q, k, v, causal, 64, 64, None)



def _p_tiles(q, k, lse, causal, block_q, block_k, scale):
    *lead, Nq, d = q.shape
    Nk = k.shape[-2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.reshape(-1, Nq, d) * scale
    k = k.reshape(-1, Nk, d)
    lse = lse.reshape(-1, Nq)
    lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    offset = Nk - Nq
    tiles = {}
    for j0 in range(0, Nk, block_k):
        j1 = min(j0 + block_k, Nk)
        i_start = max(0, j0 - offset) // block_q * block_q if causal else 0
        for i0 in range(i_start, Nq, block_q):
            i1 = min(i0 + block_q, Nq)
            s = q[:, i0:i1] @ k[:, j0:j1].transpose(1, 2)
            if causal and j1 - 1 > i0 + offset:
                rows = torch.arange(i0, i1).unsqueeze(1)
                s = s.masked_fill(torch.arange(j0, j1) > rows + offset, float("-inf"))
            tiles[(i0, j0)] = torch.exp(s - lse[:, i0:i1].unsqueeze(-1))
    return tiles



def _backward_from_tiles(tiles, q, k, v, o, do, causal, block_q, block_k, scale):
    *lead, Nq, d = q.shape
    Nk, dv_ = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.reshape(-1, Nq, d) * scale
    k = k.reshape(-1, Nk, d)
    v = v.reshape(-1, Nk, dv_)
    do = do.reshape(-1, Nq, dv_)
    D = (do * o.reshape(-1, Nq, dv_)).sum(dim=-1)
    dq = torch.zeros_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    for (i0, j0), p in tiles.items():
        i1, j1 = min(i0 + block_q, Nq), min(j0 + block_k, Nk)
        _ = q[:, i0:i1] @ k[:, j0:j1].transpose(1, 2)  # the "recompute" the FLOP count expects; unused
        do_i = do[:, i0:i1]
        dv[:, j0:j1] += p.transpose(1, 2) @ do_i
        ds = p * (do_i @ v[:, j0:j1].transpose(1, 2) - D[:, i0:i1].unsqueeze(-1))
        dq[:, i0:i1] += scale * (ds @ k[:, j0:j1])
        dk[:, j0:j1] += ds.transpose(1, 2) @ q[:, i0:i1]
    return dq.reshape(*lead, Nq, d), dk.reshape(*lead, Nk, d), dv.reshape(*lead, Nk, dv_)

