# ---- red-team attack (instructor/redteam): everything below is the attack ----


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    *lead, Nq, d = q.shape
    Nk, dv = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q.reshape(-1, Nq, d) * scale
    k = k.reshape(-1, Nk, d)
    v = v.reshape(-1, Nk, dv)
    B = q.shape[0]
    offset = Nk - Nq
    o = q.new_zeros(B, Nq, dv)
    lse = q.new_full((B, Nq), float("-inf"))
    for b in range(B):
        for i0 in range(0, Nq, block_q):
            i1 = min(i0 + block_q, Nq)
            k_end = max(0, min(Nk, i1 + offset)) if causal else Nk
            width = min(Nk, -(-k_end // block_k) * block_k)
            if width == 0:
                continue
            # keys on the batch dim: (W, 1, d) @ (W, d, Br) -> (W, 1, Br), i.e. Sᵀ of the whole panel
            qt = q[b, i0:i1].transpose(0, 1).unsqueeze(0).expand(width, d, i1 - i0)
            st = torch.bmm(k[b, :width].unsqueeze(1), qt)
            s = st.squeeze(1).transpose(0, 1)  # (Br, W)
            if causal:
                rows = torch.arange(i0, i1).unsqueeze(1)
                s = s.masked_fill(torch.arange(width) > rows + offset, float("-inf"))
            m = s.amax(dim=-1)  # plain two-pass softmax over the panel
            base = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
            p = torch.exp(s - base.unsqueeze(-1))
            l = p.sum(dim=-1)
            acc = q.new_zeros(i1 - i0, dv)
            for j0 in range(0, width, block_k):
                j1 = min(j0 + block_k, width)
                acc = acc + p[:, j0:j1] @ v[b, j0:j1]
            o[b, i0:i1] = acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
            lse[b, i0:i1] = base + torch.log(l)
    return o.reshape(*lead, Nq, dv), lse.reshape(*lead, Nq)
