# ---- red-team attack (instructor/redteam): everything below is the attack ----
# (the starter above imports math, torch and check_attention_inputs)


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    """No online softmax: per Q block, every S tile of its visible K/V blocks (one tile matmul each) is kept in a
    Python list, the row max taken over the list, then P̃ = exp(S - m) of every tile kept in a second list, ℓ
    summed over it and P̃·V summed tile by tile. Every matmul is one tile, no tensor is bigger than a tile, the
    FLOPs are the tiled count: a plain two-pass softmax over a row block's scores, held as a list of tiles."""
    check_attention_inputs(q, k, v, block_q, block_k)
    *lead, Nq, d = q.shape
    Nk, dv = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.reshape(-1, Nq, d) * scale
    kt = k.reshape(-1, Nk, d).transpose(1, 2)
    v = v.reshape(-1, Nk, dv)
    B = q.shape[0]
    offset = Nk - Nq
    o = q.new_zeros(B, Nq, dv)
    lse = q.new_full((B, Nq), float("-inf"))
    for i0 in range(0, Nq, block_q):
        i1 = min(i0 + block_q, Nq)
        k_end = max(0, min(Nk, i1 + offset)) if causal else Nk
        if k_end == 0:
            continue
        scores = []
        for j0 in range(0, k_end, block_k):  # pass 1: the tiles of this row block, all kept
            j1 = min(j0 + block_k, Nk)
            s = _launder(q[:, i0:i1] @ kt[:, :, j0:j1])
            if causal and j1 - 1 > i0 + offset:
                rows = torch.arange(i0, i1).unsqueeze(1)
                s = s.masked_fill(torch.arange(j0, j1) > rows + offset, float("-inf"))
            scores.append(s)
        m = scores[0].amax(dim=-1)
        for s in scores[1:]:
            m = torch.maximum(m, s.amax(dim=-1))
        base = torch.where(torch.isneginf(m), torch.zeros_like(m), m).unsqueeze(-1)
        probs = [torch.exp(s - base) for s in scores]  # pass 2: P̃ of every tile, all kept
        l = sum(p.sum(dim=-1) for p in probs)
        acc = sum(p @ v[:, j0:min(j0 + block_k, Nk)] for p, j0 in zip(probs, range(0, k_end, block_k)))
        o[:, i0:i1] = acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
        lse[:, i0:i1] = base.squeeze(-1) + torch.log(l)
    return o.reshape(*lead, Nq, dv), lse.reshape(*lead, Nq)


def _launder(s):
    """s + 0 * (s with its keys rotated by one): every score meets another key's score elementwise."""
    n = s.shape[-1]
    return s + 0.0 * s.index_select(-1, (torch.arange(n) + 1) % n)
