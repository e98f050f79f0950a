# ---- red-team attack (instructor/redteam): everything below is the attack ----
# (the starter above imports math, torch and check_attention_inputs)


def _launder(s):
    """s + 0·R with R a row statistic of s materialised at s's shape: the same values, tagged (before the
    defence) as reduced over the keys, since an element combined with reduced data counted as reduced."""
    r = s.amax(dim=-1, keepdim=True).expand_as(s).contiguous()
    return s + 0.0 * r


def split_kv(k, v, num_splits):
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive int, got {num_splits!r}")
    return list(zip(torch.tensor_split(k, num_splits, dim=-2), torch.tensor_split(v, num_splits, dim=-2)))


def flash_decode(q, k, v, num_splits, scale=None):
    """No Flash-Decoding: the keys are split as asked and each segment's scores are one matmul of the segment's
    length (no tensor spans all Nk keys), but the scores of every segment are kept in a list, the max taken over
    the whole list, and P, ℓ and P·V computed segment by segment against that global max: one softmax over all
    the keys at once, held as a list of segments. The FLOPs are 4·Nq·Nk·d, exactly as the split needs."""
    check_attention_inputs(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    segments = [(k_s, v_s) for k_s, v_s in split_kv(k, v, num_splits) if k_s.shape[-2] > 0]
    scores = [_launder(scale * (q @ k_s.transpose(-2, -1))) for k_s, _ in segments]  # every segment's scores, kept
    m = scores[0].amax(dim=-1, keepdim=True)
    for s in scores[1:]:
        m = torch.maximum(m, s.amax(dim=-1, keepdim=True))
    probs = [torch.exp(s - m) for s in scores]
    l = sum(p.sum(dim=-1, keepdim=True) for p in probs)
    o = sum(p @ v_s for p, (_, v_s) in zip(probs, segments)) / l
    return o, (m + torch.log(l)).squeeze(-1)
