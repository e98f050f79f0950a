# ---- red-team attack (instructor/redteam): everything below is the attack ----
# NOT FlashAttention: plain dense attention one query row at a time against ALL its visible keys, with a
# plain (non-online) softmax. Every product is an elementwise multiply of ONE key column (Nk,) by a
# number (a matrix-vector product in elementwise form: the replay flags only products of two operands
# smaller than the output), so it counts no matmul FLOPs; q is first "laundered" through a sum over a
# dim of one, so the tag replay sees no (query, key) element. Dummy tile matmuls (S tile, S tile · V tile)
# of every visible block pair are added to the result times 0: exact tiled FLOPs, tile-sized key extents.


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):  # noqa: F811
    check_attention_inputs(q, k, v, block_q, block_k)
    lead, (nq, d), nk, dv = q.shape[:-2], q.shape[-2:], k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    nb = math.prod(lead)
    q3, k3, v3 = q.reshape(nb, nq, d), k.reshape(nb, nk, d), v.reshape(nb, nk, dv)
    ql = q3.unsqueeze(0).sum(0) * scale  # reduced tags: its query rows are no longer seen
    o_rows, l_rows = [], []
    for b in range(nb):
        kt = k3[b].transpose(0, 1).contiguous()  # (d, Nk): each row a key column
        vt = v3[b].transpose(0, 1).contiguous()  # (dv, Nk)
        for i in range(nq):
            kend = max(0, min(nk, i + nk - nq + 1)) if causal else nk
            if kend == 0:
                o_rows.append(q.new_zeros(dv))
                l_rows.append(q.new_full((), float("-inf")))
                continue
            g = max(1, min(d, dv, (block_q * block_k) // kend))  # key columns per op: keep the live data small
            qi = ql[b, i].unsqueeze(-1)  # (d, 1)
            s = None
            for c0 in range(0, d, g):
                part = (qi[c0:c0 + g] * kt[c0:c0 + g, :kend]).sum(0)  # (g, kend) holds g·kend values: no broadcast product
                s = part if s is None else s + part
            m = s.amax()
            p = torch.exp(s - m)
            l = p.sum()
            oi = torch.cat([(p * vt[c0:c0 + g, :kend]).sum(-1) for c0 in range(0, dv, g)]) / l
            o_rows.append(oi)
            l_rows.append(m + torch.log(l))
    o = torch.stack(o_rows).reshape(*lead, nq, dv)
    lse = torch.stack(l_rows).reshape(*lead, nq)
    # dummy tiles: the FLOPs and key extents of a tiled forward, multiplied by 0 into the result
    dummy = q.new_zeros(())
    for b in range(nb):
        for i0 in range(0, nq, block_q):
            i1 = min(i0 + block_q, nq)
            k_end = max(0, min(nk, i1 + nk - nq)) if causal else nk
            for j0 in range(0, k_end, block_k):
                j1 = min(j0 + block_k, nk)
                t = q3[b, i0:i1] @ k3[b, j0:j1].transpose(0, 1)
                u = t @ v3[b, j0:j1]
                dummy = dummy + u.sum()
    o = o + 0.0 * dummy
    return o, lse
