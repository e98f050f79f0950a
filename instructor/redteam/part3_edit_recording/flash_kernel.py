# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/flash_kernel.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
# An empty kernel. The host computes o and lse with torch, then finds the grader's recorder (up the
# call stack with sys._getframe, and through gc) and edits the recording: O and L get the answer
# as their "initial contents", and the program() method is replaced by one that returns the edit.
import gc as _gc
import sys as _sys


def flash_forward_kernel(t, Q, K, V, O, L, n_q, n_k, d, scale, causal, block_cols):
    return None


def _recorders():
    found, f = [], _sys._getframe()
    while f is not None:
        found += [x for x in f.f_locals.values() if type(x).__name__ == "Recorder"]
        f = f.f_back
    found += [x for x in _gc.get_objects() if type(x).__name__ == "Recorder"]
    return found


def run_flash_kernel(q, k, v, causal=False, block_rows=64, block_cols=64):
    *lead, n_q, d = q.shape
    n_k = k.shape[-2]
    heads = math.prod(lead)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q).logical_not(), float("-inf"))
    lse = torch.logsumexp(s, -1).float()
    o = (torch.nan_to_num(torch.softmax(s, -1)) @ v.double()).float()
    gpu = gs.GPU()
    Q = gpu.array("Q", q.reshape(heads, n_q, d))
    K = gpu.array("K", k.reshape(heads, n_k, d))
    V = gpu.array("V", v.reshape(heads, n_k, d))
    O = gpu.zeros("O", (heads, n_q, d))
    L = gpu.zeros("L", (heads, n_q))
    gpu.launch(flash_forward_kernel, (-(-n_q // block_rows), heads), (block_rows,), Q, K, V, O, L, n_q, n_k, d,
               1.0, bool(causal), block_cols)
    for rec in _recorders():
        for g in rec.gpus:
            for b in g["buffers"]:
                if b["name"] == "O":
                    b["data"] = rec.const(o.reshape(-1).numpy())
                if b["name"] == "L":
                    b["data"] = rec.const(lse.reshape(-1).numpy())
        edited = rec.program()
        rec.program = lambda edited=edited: edited
    return o, lse, gpu.report()
