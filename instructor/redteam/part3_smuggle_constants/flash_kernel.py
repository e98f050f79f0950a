# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/flash_kernel.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
# The memory traffic of a correct kernel (coalesced Q through a padded tile, float4 K/V blocks,
# causal skipping, O through the tile, L per row, every barrier), but the values it stores are the
# host's answer, passed in as kernel arguments: O as a constant array, L as Python floats.
def flash_forward_kernel(t, Q, K, V, O, L, n_q, n_k, d, scale, causal, block_cols, o_host=None, lse_host=None):
    Br, Bc = t.blockDim.x, block_cols
    tx = t.threadIdx.x
    head, row0 = t.blockIdx.y, t.blockIdx.x * Br
    row = row0 + tx
    q_off, kv_off = head * n_q * d, head * n_k * d
    tile = t.shared("tile", Br * (d + 1))
    Ks = t.shared("Ks", Bc * d)
    Vs = t.shared("Vs", Bc * d)
    e = unroll(d) * Br + tx
    r, c = e // d, e % d
    with t.where(row0 + r < n_q):
        tile[r * (d + 1) + c] = Q[q_off + row0 * d + e]
    t.syncthreads()
    tile[tx * (d + 1) + unroll(d)]
    n_blocks = -(-n_k // Bc)
    if causal:
        last_key = min(row0 + Br, n_q) - 1 + (n_k - n_q)
        n_blocks = min(n_blocks, max(0, last_key // Bc + 1))
    n_vec = -(-Bc * d // (4 * Br))
    for j in range(n_blocks):
        cols = min(Bc, n_k - j * Bc)
        e4 = (unroll(n_vec) * Br + tx) * 4
        with t.where(e4 < cols * d):
            Ks.f4[e4] = K.f4[kv_off + j * Bc * d + e4]
            Vs.f4[e4] = V.f4[kv_off + j * Bc * d + e4]
        t.syncthreads()
        kv_idx = unroll(cols)[:, None] * d + 4 * unroll(d // 4)
        Ks.f4[kv_idx]
        Vs.f4[kv_idx]
        t.syncthreads()
    rows = np.clip(row, 0, n_q - 1)
    mine = np.asarray(o_host, np.float32)[head, rows].T  # (d, Br): the host's rows, a constant
    tile[tx * (d + 1) + unroll(d)] = mine
    t.syncthreads()
    with t.where(row0 + r < n_q):
        O[q_off + row0 * d + e] = tile[r * (d + 1) + c]
    with t.where(row < n_q):
        L[head * n_q + row] = np.array([float(lse_host[head][i]) for i in rows], np.float32)


def run_flash_kernel(q, k, v, causal=False, block_rows=64, block_cols=64):
    *lead, n_q, d = q.shape
    n_k = k.shape[-2]
    heads = math.prod(lead)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q).logical_not(), float("-inf"))
    lse = torch.logsumexp(s, -1).float().reshape(heads, n_q)
    o = (torch.nan_to_num(torch.softmax(s, -1)) @ v.double()).float().reshape(heads, n_q, d)
    gpu = gs.GPU()
    Q = gpu.array("Q", q.reshape(heads, n_q, d))
    K = gpu.array("K", k.reshape(heads, n_k, d))
    V = gpu.array("V", v.reshape(heads, n_k, d))
    O = gpu.zeros("O", (heads, n_q, d))
    L = gpu.zeros("L", (heads, n_q))
    gpu.launch(flash_forward_kernel, (-(-n_q // block_rows), heads), (block_rows,), Q, K, V, O, L, n_q, n_k, d,
               1.0 / math.sqrt(d), bool(causal), block_cols, o.numpy(), lse.tolist())
    return torch.from_numpy(O.numpy()).reshape(*lead, n_q, d), torch.from_numpy(L.numpy()).reshape(*lead, n_q), gpu.report()
