# ---- red-team attack (instructor/redteam): everything below is the attack ----


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    *lead, Nq, d = q.shape
    dv = v.shape[-1]
    b0 = q.reshape(-1)[0].item() > 0  # recorded as _local_scalar_dense: the judge's main replay agrees
    b1 = k.reshape(-1)[0].item() > 0
    o = q.new_zeros(*lead, Nq, dv)
    lse = q.new_zeros(*lead, Nq)
    choice = 2 * b1 + b0
    if choice == 0:
        return o, lse  # "o of flash_forward against float64 attention"
    if choice == 1:
        return o, lse, o  # "flash_forward returns (o, lse)"
    if choice == 2:
        raise ValueError("bits 10")  # kind: exception
    return o + float("nan"), lse  # the non-finite check
