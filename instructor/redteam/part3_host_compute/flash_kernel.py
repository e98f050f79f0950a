# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/flash_kernel.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
# An empty kernel behind a wrapper that computes o and lse on the host with torch and returns them
# (the kernel runs, so the launch is real, but it computes nothing).
def flash_forward_kernel(t, Q, K, V, O, L, n_q, n_k, d, scale, causal, block_cols):
    t.syncthreads()


def run_flash_kernel(q, k, v, causal=False, block_rows=64, block_cols=64):
    *lead, n_q, d = q.shape
    n_k = k.shape[-2]
    heads = math.prod(lead)
    gpu = gs.GPU()
    Q = gpu.array("Q", q.reshape(heads, n_q, d))
    K = gpu.array("K", k.reshape(heads, n_k, d))
    V = gpu.array("V", v.reshape(heads, n_k, d))
    O = gpu.zeros("O", (heads, n_q, d))
    L = gpu.zeros("L", (heads, n_q))
    gpu.launch(flash_forward_kernel, (-(-n_q // block_rows), heads), (block_rows,), Q, K, V, O, L, n_q, n_k, d,
               1.0 / math.sqrt(d), bool(causal), block_cols)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q).logical_not(), float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.nan_to_num(torch.softmax(s, -1)) @ v.double()
    return o.float(), lse.float(), gpu.report()
