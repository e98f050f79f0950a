# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/flash_kernel.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
# Dense attention in registers: no shared memory at all; every thread loads its q row and the WHOLE
# of K and V with broadcast float4 loads into per-thread values and does a two-pass safe softmax.
# Right values and only Q/K/V/O/L; its uncoalesced q/o rows miss the exact DRAM bytes.
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
    # NOT flash: no shared memory, no tiles, no online softmax. Every thread loads its q row and the
    # WHOLE K and V (broadcast loads) into registers and does a dense two-pass safe softmax.
    Br = t.blockDim.x
    tx = t.threadIdx.x
    head, row0 = t.blockIdx.y, t.blockIdx.x * Br
    row = row0 + tx
    q_off, kv_off = head * n_q * d, head * n_k * d
    with t.where(row < n_q):
        q = Q[q_off + row * d + unroll(d)]                      # (d, Br), uncoalesced
    idx = kv_off + unroll(n_k)[:, None] * d + 4 * unroll(d // 4)  # (n_k, d/4, 1): broadcast
    k_all = K.f4[idx].reshape(n_k, d, -1)[..., 0]
    v_all = V.f4[idx].reshape(n_k, d, -1)[..., 0]
    s = scale * (k_all @ q)                                      # (n_k, Br): the FULL row of S
    if causal:
        s = np.where(unroll(n_k) > row + (n_k - n_q), np.float32(-np.inf), s)
    m = s.max(0)
    seen = m > -np.inf
    ms = np.where(seen, m, np.float32(0))
    p = np.exp(s - ms)
    l = p.sum(0)
    o = np.where(seen, (v_all.T @ p) / np.where(seen, l, 1), np.float32(0))
    with t.where(row < n_q):
        O[q_off + row * d + unroll(d)] = o
        L[head * n_q + row] = np.where(seen, ms + np.log(np.where(seen, l, 1)), np.float32(-np.inf))
