# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/flash_kernel.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
# An empty kernel. The host computes o and lse with torch, writes them straight into the O and L
# buffers (buffer.data, not through a kernel), and forges the counters: the launch's stats dict,
# the GPU's list of launches, the report, and every stats dict reachable through gc (the capture
# the grader used to keep is the same live object), all set to the closed-form values.
import gc as _gc


def flash_forward_kernel(t, Q, K, V, O, L, n_q, n_k, d, scale, causal, block_cols):
    return None


def _forged(n_q, n_k, d, heads, block_rows):
    kv = 4 * heads * d * n_k * -(-n_q // block_rows)
    qo = 4 * heads * n_q * d
    lb = 4 * heads * n_q
    per = {"Q": (qo, qo), "K": (kv, 4 * heads * d * n_k), "V": (kv, 4 * heads * d * n_k), "O": (qo, qo), "L": (lb, lb)}
    bufs = {n: {"dram_bytes_no_cache": a, "dram_bytes_ideal_cache": b, "global_load_bytes": a, "global_store_bytes": 0,
                "elements": 1, "shape": [1], "bytes": 4} for n, (a, b) in per.items()}
    return {"dram_bytes_no_cache": sum(a for a, _ in per.values()), "dram_bytes_ideal_cache": sum(b for _, b in per.values()),
            "races": 0, "race_reports": [], "launches": 1, "buffers": bufs}


def run_flash_kernel(q, k, v, causal=False, block_rows=64, block_cols=64):
    *lead, n_q, d = q.shape
    n_k = k.shape[-2]
    heads = math.prod(lead)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q).logical_not(), float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.nan_to_num(torch.softmax(s, -1)) @ v.double()
    gpu = gs.GPU()
    Q = gpu.array("Q", q.reshape(heads, n_q, d))
    K = gpu.array("K", k.reshape(heads, n_k, d))
    V = gpu.array("V", v.reshape(heads, n_k, d))
    O = gpu.zeros("O", (heads, n_q, d))
    L = gpu.zeros("L", (heads, n_q))
    stats = gpu.launch(flash_forward_kernel, (1,), (32,), Q, K, V, O, L, n_q, n_k, d, 1.0, bool(causal), block_cols)
    O.data[:] = o.float().reshape(-1).numpy()
    L.data[:] = lse.float().reshape(-1).numpy()
    fake = _forged(n_q, n_k, d, heads, block_rows)
    for obj in [stats, *gpu.launches] + [x for x in _gc.get_objects() if type(x) is dict and "kernels" in x and "buffers" in x]:
        for name, b in fake["buffers"].items():
            obj["buffers"].setdefault(name, {}).update(b)
        obj.update({k: v for k, v in fake.items() if k != "buffers"})
    return o.float(), lse.float(), gpu.report()
