# ---- red-team attack (instructor/redteam): everything below is the attack ----
# (the starter above imports math, torch and check_attention_inputs)


def attention_partial(
    q: torch.Tensor, k_seg: torch.Tensor, v_seg: torch.Tensor, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    check_attention_inputs(q, k_seg, v_seg)
    ### BEGIN SOLUTION
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if k_seg.shape[-2] == 0:
        o = q.new_zeros(q.shape[:-1] + v_seg.shape[-1:])
        return o, q.new_full(q.shape[:-1], float("-inf"))
    s = scale * (q @ k_seg.transpose(-2, -1))
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    return (p @ v_seg) / l, (m + torch.log(l)).squeeze(-1)



def flash_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_splits: int, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    check_attention_inputs(q, k, v)
    ### BEGIN SOLUTION
    if num_splits <= 1:
        return attention_partial(q, k, v, scale)
    # one dense pass over ALL keys, padded by one masked key so that no tensor has Nk along any dim
    *lead, Nq, d = q.shape
    Nk, dv = k.shape[-2], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    dt = q.dtype
    q = q.double()  # float64 accumulation is legal
    kp = torch.cat([k, k.new_zeros(*lead, 1, d)], dim=-2).double()
    vp = torch.cat([v, v.new_zeros(*lead, 1, dv)], dim=-2).double()
    s = (q * scale) @ kp.transpose(-2, -1)
    s = s.masked_fill(torch.arange(Nk + 1) == Nk, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    base = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = torch.exp(s - base)
    l = p.sum(dim=-1, keepdim=True)
    o = (p @ vp) / torch.where(l == 0, torch.ones_like(l), l)
    return o.to(dt), (base + torch.log(l)).squeeze(-1).to(dt)

