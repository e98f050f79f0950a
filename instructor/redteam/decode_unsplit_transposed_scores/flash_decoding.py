# ---- red-team attack (instructor/redteam): everything below is the attack ----


def flash_decode(q, k, v, num_splits, scale=None):
    *lead, Nq, d = q.shape
    Nk, dv = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if Nk == 0:
        return q.new_zeros(*lead, Nq, dv), q.new_full((*lead, Nq), float("-inf"))
    qf = q.reshape(-1, Nq, d) * scale
    kf = k.reshape(-1, Nk, d)
    vf = v.reshape(-1, Nk, dv)
    st = torch.bmm(kf, qf.transpose(1, 2))  # (B, Nk, Nq): every key at once, Nk NOT the last dim
    m = st.amax(dim=1, keepdim=True)  # (B, 1, Nq)
    pt = torch.exp(st - m)  # (B, Nk, Nq)
    l = pt.sum(dim=1)  # (B, Nq)
    o = torch.bmm(pt.transpose(1, 2), vf) / l.unsqueeze(-1)  # (B, Nq, dv)
    lse = m.squeeze(1) + torch.log(l)
    return o.reshape(*lead, Nq, dv), lse.reshape(*lead, Nq)
