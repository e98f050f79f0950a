# redteam-base: solutions/flash_decoding.py
# Base + edits (instructor/redteam/README.md): only what this attack replaces in, or adds to, the base.


def flash_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_splits: int, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash-Decoding attention (no mask). q: (..., Nq, d) (Nq is 1 when decoding),
    k: (..., Nk, d), v: (..., Nk, dv). Returns o: (..., Nq, dv) and lse: (..., Nq)."""
    check_attention_inputs(q, k, v)
    # ---- red-team attack (redteam6) ----
    # NOT Flash-Decoding: no partials and no ⊕. The keys are split as asked, but every segment's scores
    # are kept and ONE softmax runs over all of them against the global max (the dense softmax held as a
    # list of segments). Scores and P·V are elementwise (q_r * k summed over d); each k segment is first
    # mixed with a 0-d z = 0 * (q[0] * k[0]) (a number to the hand-made-product rule; a REDUCED query tag
    # to the tag replay), so the scores carry no (query, key) tag. Dummy matmuls times 0 give the FLOPs.
    scale_ = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    *lead, Nq, d = q.shape
    Nk, dv = k.shape[-2], v.shape[-1]
    qf = q.reshape(-1, Nq, d) * scale_
    segs = [(ks.reshape(-1, ks.shape[-2], d), vs.reshape(-1, vs.shape[-2], dv)) for ks, vs in split_kv(k, v, num_splits) if ks.shape[-2] > 0]
    segs = [(ks, vs) for ks, vs in segs if ks.shape[-2] > 0]
    z = (qf.reshape(-1)[:1] * segs[0][0].reshape(-1)[:1]).sum() * 0.0
    rows_o, rows_l = [], []
    for r in range(Nq):
        q_r = qf[:, r:r + 1, :]
        ss = [(q_r * (ks + z)).sum(-1) for ks, _ in segs]  # (B, n_s) each
        m = ss[0].amax(-1, keepdim=True)
        for s in ss[1:]:
            m = torch.maximum(m, s.amax(-1, keepdim=True))
        ps = [torch.exp(s - m) for s in ss]
        l = ps[0].sum(-1, keepdim=True)
        for p in ps[1:]:
            l = l + p.sum(-1, keepdim=True)
        acc = None
        for p, (_, vs) in zip(ps, segs):
            t = (p.unsqueeze(-1) * vs).sum(1)
            acc = t if acc is None else acc + t
        rows_o.append(acc / l)
        rows_l.append(m + torch.log(l))
    o = torch.stack(rows_o, 1)
    lse = torch.cat(rows_l, -1)
    for ks, vs in segs:
        o = o + ((qf @ ks.transpose(1, 2)) @ vs) * 0.0
    return o.reshape(*lead, Nq, dv).to(q.dtype), lse.reshape(*lead, Nq).to(q.dtype)
