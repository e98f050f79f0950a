# redteam-base: solutions/flash_kernel.py
# Base + edits (instructor/redteam/README.md): only what this attack replaces in, or adds to, the base.


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
    Br, Bc = t.blockDim.x, block_cols
    tx = t.threadIdx.x  # (Br,): this thread's row within the Q block
    head, row0 = t.blockIdx.y, t.blockIdx.x * Br
    row = row0 + tx  # (Br,): this thread's query row
    q_off, kv_off = head * n_q * d, head * n_k * d
    tile = t.shared("tile", Br * (d + 1))  # Q in, O out: d + 1 columns, conflict-free both ways
    Ks = t.shared("Ks", Bc * d)
    Vs = t.shared("Vs", Bc * d)

    # 1. Q_i: element e = u·Br + tx of the tile (u = 0..d-1), i.e. consecutive threads read
    #    consecutive elements (coalesced); each thread then reads its own row (stride d + 1).
    e = unroll(d) * Br + tx  # (d, Br)
    r, c = e // d, e % d
    with t.where(row0 + r < n_q):
        tile[r * (d + 1) + c] = Q[q_off + row0 * d + e]
    t.syncthreads()
    q = tile[tx * (d + 1) + unroll(d)]  # (d, Br): register q[c] of every thread

    m = np.zeros(Br, np.float32)
    l = np.zeros(Br, np.float32)
    acc = np.zeros((d, Br), np.float32)
    n_blocks = -(-n_k // Bc)
    if causal:  # §6.2: the block's last row sees keys <= last_row + n_k - n_q; skip the rest
        last_key = min(row0 + Br, n_q) - 1 + (n_k - n_q)
        n_blocks = min(n_blocks, max(0, last_key // Bc + 1))
    n_vec = -(-Bc * d // (4 * Br))  # float4 loads per thread per K (or V) block
    for j in range(n_blocks):
        col0 = j * Bc
        cols = min(Bc, n_k - col0)  # the last K/V block may be ragged
        # 2. cooperative float4 loads of K_j and V_j (contiguous: coalesced and conflict-free)
        e4 = (unroll(n_vec) * Br + tx) * 4  # (n_vec, Br): first element of each float4
        with t.where(e4 < cols * d):
            Ks.f4[e4] = K.f4[kv_off + col0 * d + e4]
            Vs.f4[e4] = V.f4[kv_off + col0 * d + e4]
        t.syncthreads()
        # scores of my row: all threads read the same K_j[c] (a broadcast), 4 floats at a time
        kv_idx = unroll(cols)[:, None] * d + 4 * unroll(d // 4)  # (cols, d/4, 1)
        k_j = Ks.f4[kv_idx].reshape(cols, d)
        s = scale * (k_j @ q)  # (cols, Br): s[c] = scale · K_j[c]·q for every thread
        if causal:
            key = col0 + unroll(cols)  # (cols, 1)
            s = np.where(key > row + (n_k - n_q), np.float32(-np.inf), s)
        # fixed shift: the first tile's max (+ headroom), never rescaled afterwards
        if j == 0:
            m0 = s.max(0)
            m = np.where(m0 == -np.inf, np.float32(0), m0) + np.float32(40)
        p = np.exp(s - m)  # (cols, Br)
        l = l + p.sum(0)
        v_j = Vs.f4[kv_idx].reshape(cols, d)
        acc = acc + v_j.T @ p
        t.syncthreads()  # everyone is done with K_j, V_j before the next block overwrites them

    # 3. O_i through the tile (thread writes its row; the block stores coalesced), then L_i
    seen = l > 0
    o = np.where(seen, acc / np.where(seen, l, 1), np.float32(0))
    tile[tx * (d + 1) + unroll(d)] = o
    t.syncthreads()
    with t.where(row0 + r < n_q):
        O[q_off + row0 * d + e] = tile[r * (d + 1) + c]
    with t.where(row < n_q):
        L[head * n_q + row] = np.where(seen, m + np.log(np.where(seen, l, 1)), np.float32(-np.inf))
