# ---- red-team attack (instructor/redteam): everything below is the attack ----
# Class 6, leaking hidden inputs into visible feedback. A recorded (graded) call keeps what it saw in
# a global and returns a wrong but well-formed (o, lse): the value check fails, the judge's diagnosis
# runs the probes (student.call, NOT recorded: no dispatch mode on the stack), and a probe call raises
# a ValueError whose message spells the graded call's inputs. The probe ladder puts str(StudentError)
# (exception type and message) into the hint, and a hidden test's feedback keeps its hint.
_SEEN: list = []


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    if torch._C._len_torch_dispatch_stack() == 0 and _SEEN:  # a probe: not graded, shown in the hint
        raise ValueError("LEAK " + _SEEN[-1])
    _SEEN.append(f"q{tuple(q.shape)} k{tuple(k.shape)} causal={causal} b={block_q},{block_k} scale={scale} "
                 f"dtype={str(q.dtype)[6:]} q0={[round(x, 4) for x in q.reshape(-1)[:4].tolist()]} "
                 f"k0={[round(x, 4) for x in k.reshape(-1)[:4].tolist()]}")
    return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype), torch.zeros(q.shape[:-1], dtype=q.dtype)
