# ---- red-team attack (instructor/redteam): everything below is the attack ----
# (the starter above imports math, torch and check_attention_inputs)


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    """No online softmax: per Q block, the S tiles of its visible K/V blocks (one tile matmul each, the ragged
    last one padded with -inf by torch.cat) are stacked with torch.stack and the stack is flattened into rows
    of 4 elements (no dim of any tensor spans more than a tile); the row max, P̃ = exp(S - m) and ℓ are taken
    on views of that flat panel, P̃·V tile by tile. Every matmul is a tile, the FLOPs are the tiled count."""
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
        r = i1 - i0
        k_end = max(0, min(Nk, i1 + offset)) if causal else Nk
        if k_end == 0:
            continue
        js = list(range(0, k_end, block_k))
        c = min(block_k, Nk)
        tiles = []
        for j0 in js:
            j1 = min(j0 + block_k, Nk)
            s = q[:, i0:i1] @ kt[:, :, j0:j1]
            if causal and j1 - 1 > i0 + offset:
                rows = torch.arange(i0, i1).unsqueeze(1)
                s = s.masked_fill(torch.arange(j0, j1) > rows + offset, float("-inf"))
            if j1 - j0 < c:
                s = torch.cat([s, s.new_full((B, r, c - (j1 - j0)), float("-inf"))], dim=-1)
            tiles.append(s)
        panel = torch.stack(tiles, dim=1).permute(0, 2, 1, 3)  # (B, r, blocks, c)
        f = 4 if panel.numel() % 4 == 0 else 1
        flat = panel.reshape(-1, f)  # small factors: rows of 4 scores
        m = flat.view(B, r, -1).amax(dim=-1)
        base = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        p = torch.exp(flat.view(B, r, -1) - base.unsqueeze(-1)).reshape(-1, f)
        l = p.view(B, r, -1).sum(dim=-1)
        pt = p.view(B, r, len(js), c)
        acc = q.new_zeros(B, r, dv)
        for n, j0 in enumerate(js):
            j1 = min(j0 + block_k, Nk)
            acc = acc + pt[:, :, n, :j1 - j0] @ v[:, j0:j1]
        o[:, i0:i1] = acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
        lse[:, i0:i1] = base + torch.log(l)
    return o.reshape(*lead, Nq, dv), lse.reshape(*lead, Nq)
