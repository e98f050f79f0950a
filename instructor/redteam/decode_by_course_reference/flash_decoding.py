# ---- red-team attack (instructor/redteam): everything below is the attack ----
# attention_partial and flash_decode answer with the course's own dense attention, reached by a name
# built at run time (course.reference.attention_plain: matmul, masked_fill, logsumexp, exp, matmul).
# Part 6's allow-list keeps logsumexp/softmax (only parts 1, 2, 4 refuse them) and attention_partial
# has no structure rule, so nothing tells the reference's ops from the student's own.
import importlib as _il  # noqa: E402

_plain = getattr(_il.import_module("course." + "reference"), "attention_" + "plain")


def attention_partial(q, k_seg, v_seg, scale=None):
    if k_seg.shape[-2] == 0:  # an empty segment arrives with other strides than the judge's copy (see report)
        return q.new_zeros(q.shape[:-1] + v_seg.shape[-1:]), q.new_full(q.shape[:-1], float("-inf"))
    return _plain(q, k_seg, v_seg, False, scale)


def flash_decode(q, k, v, num_splits, scale=None):
    return _plain(q, k, v, False, scale)  # no split at all
