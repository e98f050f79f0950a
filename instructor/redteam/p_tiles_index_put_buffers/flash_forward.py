# ---- red-team attack (instructor/redteam): everything below is the attack ----
# (the starter above imports math, torch and check_attention_inputs)


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    """No online softmax: one small zero buffer per (Q block, K/V block) tile, all allocated up front (Nq × Nk
    per head in total, none bigger than a tile); pass 1 writes every S tile into its buffer with index_put_,
    pass 2 turns each buffer into P̃ in place (sub_, exp_) against its row block's max over all its buffers,
    then ℓ and P̃·V tile by tile. Every matmul is a tile and the FLOPs are the tiled count."""
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
    tiles = {}
    for i0 in range(0, Nq, block_q):  # the buffers: every visible tile of the whole score matrix
        i1 = min(i0 + block_q, Nq)
        k_end = max(0, min(Nk, i1 + offset)) if causal else Nk
        for j0 in range(0, k_end, block_k):
            tiles[i0, j0] = q.new_zeros(B, i1 - i0, min(j0 + block_k, Nk) - j0)
    for (i0, j0), buf in tiles.items():  # pass 1: S into the buffers, element by element through index_put_
        i1, j1 = i0 + buf.shape[1], j0 + buf.shape[2]
        s = q[:, i0:i1] @ kt[:, :, j0:j1]
        if causal and j1 - 1 > i0 + offset:
            rows = torch.arange(i0, i1).unsqueeze(1)
            s = s.masked_fill(torch.arange(j0, j1) > rows + offset, float("-inf"))
        bi = torch.arange(B).reshape(B, 1, 1)
        ri = torch.arange(i1 - i0).reshape(1, -1, 1)
        ci = torch.arange(j1 - j0).reshape(1, 1, -1)
        buf.index_put_((bi, ri, ci), s)
    for i0 in range(0, Nq, block_q):  # pass 2: a plain softmax over each row block's buffers
        i1 = min(i0 + block_q, Nq)
        mine = [(j0, buf) for (r0, j0), buf in tiles.items() if r0 == i0]
        if not mine:
            continue
        m = mine[0][1].amax(dim=-1)
        for _, buf in mine[1:]:
            m = torch.maximum(m, buf.amax(dim=-1))
        base = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        l = q.new_zeros(B, i1 - i0)
        acc = q.new_zeros(B, i1 - i0, dv)
        for j0, buf in mine:
            buf.sub_(base.unsqueeze(-1)).exp_()
            l = l + buf.sum(dim=-1)
            acc = acc + buf @ v[:, j0:j0 + buf.shape[2]]
        o[:, i0:i1] = acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
        lse[:, i0:i1] = base + torch.log(l)
    return o.reshape(*lead, Nq, dv), lse.reshape(*lead, Nq)
