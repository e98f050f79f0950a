# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/flash_kernel.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
# Dense attention with K/V spread over the block's B_r threads' registers: the block streams the
# K/V tiles through shared memory exactly as FlashAttention does (exact DRAM bytes, coalesced float4,
# barriers), but every thread COPIES its slice of each tile (the float4s it loaded) into registers
# and keeps them all: after the sweep the block holds every key's K and V, Nk·d/B_r words of each per
# thread, a few words in each thread, far under the per-thread bound. Then a dense two-pass softmax:
# pass A writes the slices back to shared memory tile by tile (each thread its own words: no
# cross-lane read) and takes each row's max over ALL its scores; pass B, the same, sums exp and P·V
# with that max. Right values, only Q/K/V/O/L, no race, one thread per query row.
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
    q = tile[tx * (d + 1) + unroll(d)]

    n_blocks = -(-n_k // Bc)
    if causal:
        last_key = min(row0 + Br, n_q) - 1 + (n_k - n_q)
        n_blocks = min(n_blocks, max(0, last_key // Bc + 1))
    n_vec = -(-Bc * d // (4 * Br))
    e4 = (unroll(n_vec) * Br + tx) * 4  # (n_vec, Br): this thread's float4s of a tile
    kept = []  # per tile: (this thread's K words, its V words): ALL of K/V, spread over the threads
    for j in range(n_blocks):
        col0 = j * Bc
        cols = min(Bc, n_k - col0)
        with t.where(e4 < cols * d):
            Ks.f4[e4] = K.f4[kv_off + col0 * d + e4]
            Vs.f4[e4] = V.f4[kv_off + col0 * d + e4]
        t.syncthreads()
        with t.where(e4 < cols * d):
            kept.append((Ks.f4[e4], Vs.f4[e4]))  # (n_vec, 4, Br): my own words, kept in registers
        t.syncthreads()

    def scores(j):
        """Restore tile j from the registers into shared memory; the row's scores of its keys."""
        col0 = j * Bc
        cols = min(Bc, n_k - col0)
        with t.where(e4 < cols * d):
            Ks.f4[e4] = kept[j][0]
            Vs.f4[e4] = kept[j][1]
        t.syncthreads()
        kv_idx = unroll(cols)[:, None] * d + 4 * unroll(d // 4)
        s = scale * (Ks.f4[kv_idx].reshape(cols, d) @ q)
        if causal:
            s = np.where(col0 + unroll(cols) > row + (n_k - n_q), np.float32(-np.inf), s)
        return s, kv_idx, cols

    m = np.full(Br, -np.inf, np.float32)
    for j in range(n_blocks):  # pass A: the row max over every key
        s, _, _ = scores(j)
        m = np.maximum(m, s.max(0))
        t.syncthreads()
    m_safe = np.where(m == -np.inf, np.float32(0), m)
    l = np.zeros(Br, np.float32)
    acc = np.zeros((d, Br), np.float32)
    for j in range(n_blocks):  # pass B: exp, sum and P·V with the known max
        s, kv_idx, cols = scores(j)
        p = np.exp(s - m_safe)
        l = l + p.sum(0)
        acc = acc + Vs.f4[kv_idx].reshape(cols, d).T @ p
        t.syncthreads()

    seen = l > 0
    o = np.where(seen, acc / np.where(seen, l, 1), np.float32(0))
    tile[tx * (d + 1) + unroll(d)] = o
    t.syncthreads()
    with t.where(row0 + r < n_q):
        O[q_off + row0 * d + e] = tile[r * (d + 1) + c]
    with t.where(row < n_q):
        L[head * n_q + row] = np.where(seen, m_safe + np.log(np.where(seen, l, 1)), np.float32(-np.inf))
