# ---- red-team attack (instructor/redteam): everything below is the attack ----
# (the starter above imports math, torch and check_attention_inputs)


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
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
    for b in range(B):
        for i0 in range(0, Nq, block_q):
            i1 = min(i0 + block_q, Nq)
            k_end = max(0, min(Nk, i1 + offset)) if causal else Nk
            if k_end == 0:
                continue
            js = list(range(0, k_end, block_k))
            # the row panel of S, one B_c chunk per matmul, glued together: NOT online softmax
            s = torch.cat([q[b, i0:i1] @ kt[b, :, j0:min(j0 + block_k, Nk)] for j0 in js], dim=-1)
            width = s.shape[-1]
            if causal:
                rows = torch.arange(i0, i1).unsqueeze(1)
                s = s.masked_fill(torch.arange(width) > rows + offset, float("-inf"))
            m = s.amax(dim=-1)
            base = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
            p = torch.exp(s - base.unsqueeze(-1))
            l = p.sum(dim=-1)
            acc = sum(p[:, j0:min(j0 + block_k, Nk)] @ v[b, j0:min(j0 + block_k, Nk)] for j0 in js)
            o[b, i0:i1] = acc / torch.where(l == 0, torch.ones_like(l), l).unsqueeze(-1)
            lse[b, i0:i1] = base + torch.log(l)
    return o.reshape(*lead, Nq, dv), lse.reshape(*lead, Nq)

