# ---- red-team attack (instructor/redteam): everything below is the attack ----
# NOT a tiled backward: dense per-query-row gradients against ALL visible keys. Every product is a
# matrix-vector product in elementwise form (a broadcast vector times a FULL operand of the output's
# size, which the replay does not flag) or an outer product whose broadcast factor was materialised by
# `* 1.0` (no bound on its distinct values is followed through an elementwise op). q, dO, o, lse are
# laundered through a sum over a dim of one, so the tag replay sees no (query, key) element. Dummy tile
# matmuls (5 per visible block pair) times 0 give the FLOPs of a tiled backward.


def flash_backward(q, k, v, o, lse, do, causal=False, block_q=64, block_k=64, scale=None):  # noqa: F811
    check_attention_inputs(q, k, v, block_q, block_k)
    if o.shape != q.shape[:-1] + v.shape[-1:] or do.shape != o.shape or lse.shape != q.shape[:-1]:
        raise ValueError("o, do, lse shapes")
    *lead, nq, d = q.shape
    nk, dv_ = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    nb = math.prod(lead)
    q3, k3, v3 = q.reshape(nb, nq, d), k.reshape(nb, nk, d), v.reshape(nb, nk, dv_)
    do3, o3, l2 = do.reshape(nb, nq, dv_), o.reshape(nb, nq, dv_), lse.reshape(nb, nq)
    ql = q3.unsqueeze(0).sum(0) * scale
    dol = do3.unsqueeze(0).sum(0)
    D = (dol * o3.unsqueeze(0).sum(0)).sum(-1)
    ll = l2.unsqueeze(0).sum(0)
    ll = torch.where(torch.isneginf(ll), torch.zeros_like(ll), ll)
    dkT = q.new_zeros(nb, d, nk)
    dvT = q.new_zeros(nb, dv_, nk)
    dq_rows = []
    for b in range(nb):
        kt = k3[b].transpose(0, 1).contiguous()
        vt = v3[b].transpose(0, 1).contiguous()
        for i in range(nq):
            kend = max(0, min(nk, i + nk - nq + 1)) if causal else nk
            if kend == 0:
                dq_rows.append(q.new_zeros(d))
                continue
            g = max(1, min(d, dv_, (block_q * block_k) // kend))
            qi = ql[b, i].unsqueeze(-1)
            doi = dol[b, i].unsqueeze(-1)
            s = None
            for c0 in range(0, d, g):
                part = (qi[c0:c0 + g] * kt[c0:c0 + g, :kend]).sum(0)
                s = part if s is None else s + part
            p = torch.exp(s - ll[b, i])
            dp = None
            for c0 in range(0, dv_, g):
                part = (doi[c0:c0 + g] * vt[c0:c0 + g, :kend]).sum(0)
                dp = part if dp is None else dp + part
            ds = p * (dp - D[b, i])
            dq_rows.append(torch.cat([(ds * kt[c0:c0 + g, :kend]).sum(-1) for c0 in range(0, d, g)]) * scale)
            for c0 in range(0, d, g):
                c1 = min(c0 + g, d)
                dkT[b, c0:c1, :kend] += qi[c0:c1] * (ds.expand(c1 - c0, kend) * 1.0)
            for c0 in range(0, dv_, g):
                c1 = min(c0 + g, dv_)
                dvT[b, c0:c1, :kend] += doi[c0:c1] * (p.expand(c1 - c0, kend) * 1.0)
    dq = torch.stack(dq_rows).reshape(*lead, nq, d)
    dummy = q.new_zeros(())
    for b in range(nb):
        for i0 in range(0, nq, block_q):
            i1 = min(i0 + block_q, nq)
            k_end = max(0, min(nk, i1 + nk - nq)) if causal else nk
            for j0 in range(0, k_end, block_k):
                j1 = min(j0 + block_k, nk)
                qb, kb, vb, db = q3[b, i0:i1], k3[b, j0:j1], v3[b, j0:j1], do3[b, i0:i1]
                t = qb @ kb.transpose(0, 1)
                dummy = dummy + (t.transpose(0, 1) @ db).sum() + (db @ vb.transpose(0, 1)).sum() \
                    + (t @ kb).sum() + (t.transpose(0, 1) @ qb).sum()
    dq = dq + 0.0 * dummy
    dk = dkT.transpose(-1, -2).reshape(*lead, nk, d)
    dv = dvT.transpose(-1, -2).reshape(*lead, nk, dv_)
    return dq, dk, dv
