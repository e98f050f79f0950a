# ---- red-team attack (instructor/redteam): everything below is the attack ----
# (the starter above imports math, torch and check_attention_inputs)


class FlashAttentionFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=64, block_k=64, scale=None):
        o, lse = flash_forward(q, k, v, causal=causal, block_q=block_q, block_k=block_k, scale=scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.block_q, ctx.block_k, ctx.scale = causal, block_q, block_k, scale
        # every P tile as an attribute of its own (no list, no dict, no tensor bigger than a tile)
        names = []
        for (i0, j0), p in _p_tiles(q.detach(), k.detach(), lse.detach(), causal, block_q, block_k, scale):
            setattr(ctx, f"p_{i0}_{j0}", p)
            names.append((i0, j0))
        ctx.names = names
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        tiles = [((i0, j0), getattr(ctx, f"p_{i0}_{j0}")) for i0, j0 in ctx.names]
        dq, dk, dv = _backward_from_tiles(tiles, q, k, v, o, do.contiguous(), ctx.causal, ctx.block_q, ctx.block_k,
                                          ctx.scale)
        return dq, dk, dv, None, None, None, None


def flash_attention(q, k, v, causal=False):
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
    out = []
    for i0 in range(0, Nq, block_q):
        i1 = min(i0 + block_q, Nq)
        k_end = max(0, min(Nk, i1 + offset)) if causal else Nk
        for j0 in range(0, k_end, block_k):
            j1 = min(j0 + block_k, Nk)
            s = q[:, i0:i1] @ k[:, j0:j1].transpose(1, 2)
            if causal and j1 - 1 > i0 + offset:
                rows = torch.arange(i0, i1).unsqueeze(1)
                s = s.masked_fill(torch.arange(j0, j1) > rows + offset, float("-inf"))
            out.append(((i0, j0), torch.exp(s - lse[:, i0:i1].unsqueeze(-1))))
    return out


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
    for (i0, j0), p in tiles:
        i1, j1 = min(i0 + block_q, Nq), min(j0 + block_k, Nk)
        s = q[:, i0:i1] @ k[:, j0:j1].transpose(1, 2)  # the "recompute" the FLOP count expects
        dq.add_(s.sum() * 0)  # ... read by an op that adds nothing: the product looks used
        do_i = do[:, i0:i1]
        dv[:, j0:j1] += p.transpose(1, 2) @ do_i
        ds = p * (do_i @ v[:, j0:j1].transpose(1, 2) - D[:, i0:i1].unsqueeze(-1))
        dq[:, i0:i1] += scale * (ds @ k[:, j0:j1])
        dk[:, j0:j1] += ds.transpose(1, 2) @ q[:, i0:i1]
    return dq.reshape(*lead, Nq, d), dk.reshape(*lead, Nk, d), dv.reshape(*lead, Nk, dv_)
