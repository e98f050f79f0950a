# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/flash_kernel.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
# Dense attention with FlashAttention's memory traffic: the block loads ALL the keys it needs (causal:
# up to the last visible B_c block, so the K/V bytes match the skipping rule) into shared memory in one
# coalesced float4 sweep; each thread then holds its whole score row and does a two-pass safe softmax.
# No K/V tiles, no running (m, ℓ, acc): right values, exact DRAM bytes, no race, only Q/K/V/O/L.
def flash_forward_kernel(
    t: gs.ThreadContext,
    Q: gs.Buffer,
    K: gs.Buffer,
    V: gs.Buffer,
    O: gs.Buffer,
    L: gs.Buffer,
    n_q: int,
    n_k: int,
    d: int,
    scale: float,
    causal: bool,
    block_cols: int,
) -> None:
    """FlashAttention-2 forward, one thread block per (Q block, head), one thread per query row.

    Q, O: global (H·n_q·d,), K, V: (H·n_k·d,), L: (H·n_q,); grid = (⌈n_q/B_r⌉, H), block = (B_r,).
    Writes O (softmax(scale·QKᵀ)V per row) and L (the rows' log-sum-exp)."""
    # NOT flash: no K/V tiles, no online softmax. The block stages ALL the keys it needs in shared
    # memory at once, then every thread holds its WHOLE score row in registers: dense safe softmax.
    Br, Bc = t.blockDim.x, block_cols
    tx = t.threadIdx.x
    head, row0 = t.blockIdx.y, t.blockIdx.x * Br
    row = row0 + tx
    q_off, kv_off = head * n_q * d, head * n_k * d
    n_keys = n_k
    if causal:  # whole Bc-sized chunks up to the last visible key (so the byte count matches)
        last_key = min(row0 + Br, n_q) - 1 + (n_k - n_q)
        n_keys = min(n_k, max(0, last_key // Bc + 1) * Bc)
    tile = t.shared("tile", Br * (d + 1))
    Ks = t.shared("Ks", max(1, n_keys) * d)
    Vs = t.shared("Vs", max(1, n_keys) * d)
    e = unroll(d) * Br + tx
    r, c = e // d, e % d
    with t.where(row0 + r < n_q):
        tile[r * (d + 1) + c] = Q[q_off + row0 * d + e]
    n_vec = -(-n_keys * d // (4 * Br))
    if n_keys:
        e4 = (unroll(n_vec) * Br + tx) * 4
        with t.where(e4 < n_keys * d):
            Ks.f4[e4] = K.f4[kv_off + e4]
            Vs.f4[e4] = V.f4[kv_off + e4]
    t.syncthreads()
    q = tile[tx * (d + 1) + unroll(d)]
    if n_keys:
        kv_idx = unroll(n_keys)[:, None] * d + 4 * unroll(d // 4)
        k_all = Ks.f4[kv_idx].reshape(n_keys, d)
        v_all = Vs.f4[kv_idx].reshape(n_keys, d)
        s = scale * (k_all @ q)                       # (n_keys, Br): the whole row of S per thread
        if causal:
            s = np.where(unroll(n_keys) > row + (n_k - n_q), np.float32(-np.inf), s)
        m = s.max(0)
        seen = m > -np.inf
        ms = np.where(seen, m, np.float32(0))
        p = np.exp(s - ms)
        l = p.sum(0)
        o = np.where(seen, (v_all.T @ p) / np.where(seen, l, 1), np.float32(0))
        lse = np.where(seen, ms + np.log(np.where(seen, l, 1)), np.float32(-np.inf))
    else:
        o = np.zeros((d, Br), np.float32) * q
        lse = np.full(Br, -np.inf, np.float32)
    t.syncthreads()
    tile[tx * (d + 1) + unroll(d)] = o
    t.syncthreads()
    with t.where(row0 + r < n_q):
        O[q_off + row0 * d + e] = tile[r * (d + 1) + c]
    with t.where(row < n_q):
        L[head * n_q + row] = lse
