# ---- red-team attack (instructor/redteam): everything below is the attack ----
# NOT Flash-Decoding: no partial results, no ⊕. The scores of every segment (one honest matmul each, so
# the FLOPs are exact) are laundered through a sum over a dim of one (the tag replay then sees no
# (query, key) element), padded with -inf and stacked into ONE (S, ..., Nq, n_max) tensor holding all the
# keys' scores at once (no dim spans Nk, so the "no tensor spans all Nk keys" rule is silent), and a single
# dense softmax with the global max is taken over it; P̃·V segment by segment.


def flash_decode(q, k, v, num_splits, scale=None):  # noqa: F811
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    segs = [(ks, vs) for ks, vs in split_kv(k, v, num_splits) if ks.shape[-2] > 0]
    if not segs:
        return q.new_zeros(q.shape[:-1] + v.shape[-1:]), q.new_full(q.shape[:-1], float("-inf"))
    n_max = max(ks.shape[-2] for ks, _ in segs)
    rows = []
    for ks, _ in segs:
        s = (q @ ks.transpose(-2, -1)) * scale
        s = s.unsqueeze(0).sum(0)  # launder: reduced tags
        if s.shape[-1] < n_max:
            s = torch.cat([s, s.new_full(s.shape[:-1] + (n_max - s.shape[-1],), float("-inf"))], -1)
        rows.append(s)
    allscores = torch.stack(rows)  # (S, ..., Nq, n_max): every key's score, live at once
    m = allscores.amax(dim=-1, keepdim=True).amax(dim=0, keepdim=True)
    p = torch.exp(allscores - m)
    l = p.sum(dim=-1).sum(dim=0)
    o = None
    for idx, (ks, vs) in enumerate(segs):
        part = p[idx][..., : ks.shape[-2]] @ vs
        o = part if o is None else o + part
    return o / l.unsqueeze(-1), m[0].squeeze(-1) + torch.log(l)
