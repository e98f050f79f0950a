# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/flash_kernel.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
# NOT FlashAttention: dense attention with a plain two-pass softmax over ALL the keys of a Q block at once.
# The block has one thread per key (blockDim = Nk rounded up to 32, not B_r): each Q block loads every key
# it needs in one coalesced sweep into registers spread over the lanes, so a thread holds only d words of
# K and of V; numpy reductions and fancy indexing ACROSS the lane axis (free "shuffles": nothing limits
# them) do the transposes, the row max/sum and P·V. No shared memory at all (so no race), DRAM bytes are
# exactly FlashAttention's, per-thread live words are O(B_r·d): the on-chip bounds are per thread and per
# block of SHARED memory, and never look at the registers of the whole block (threads × words).


def dense_lanes_kernel(t, Q, K, V, O, L, n_q, n_k, d, scale, causal, block_rows):
    NT = t.blockDim.x
    j = t.threadIdx.x  # (NT,)
    head, row0 = t.blockIdx.y, t.blockIdx.x * block_rows
    rows = min(block_rows, n_q - row0)
    q_off, kv_off = head * n_q * d, head * n_k * d
    keys = n_k
    if causal:
        last_key = row0 + rows - 1 + (n_k - n_q)
        keys = min(n_k, max(0, (last_key // block_cols_g[0] + 1) * block_cols_g[0]))
    # Q block: rows·d elements, coalesced
    uq = -(-(rows * d) // NT)
    eq = unroll(uq) * NT + j  # (uq, NT)
    with t.where(eq < rows * d):
        xq = Q[q_off + row0 * d + eq]
    # gather into (B_r, d) across lanes
    r_idx = np.arange(rows)[:, None] * d + np.arange(d)[None, :]
    qb = xq[r_idx // NT, r_idx % NT]  # (rows, d)
    m = np.full(rows, -np.inf, np.float32)
    o = np.zeros((rows, d), np.float32)
    l = np.zeros(rows, np.float32)
    if keys > 0:
        uk = -(-(keys * d) // NT)
        ek = unroll(uk) * NT + j
        with t.where(ek < keys * d):
            xk = K[kv_off + ek]
            xv = V[kv_off + ek]
        c_idx = np.arange(d)[:, None] + np.minimum(np.arange(NT), keys - 1)[None, :] * d  # (d, NT): element of key j, dim c
        kT = xk[c_idx // NT, c_idx % NT]  # (d, NT): lane j holds key j
        vT = xv[c_idx // NT, c_idx % NT]
        s = scale * (qb @ kT)  # (rows, NT)
        key = np.arange(NT)[None, :]
        row = (row0 + np.arange(rows))[:, None]
        bad = key >= keys
        if causal:
            bad = bad | (key > row + (n_k - n_q))
        s = np.where(bad, np.float32(-np.inf), s)
        m = s.max(-1)  # across lanes: the whole row at once
        m_safe = np.where(m == -np.inf, np.float32(0), m)
        p = np.exp(s - m_safe[:, None])
        l = p.sum(-1)
        o = (p[:, None, :] * vT[None, :, :]).sum(-1)  # (rows, d)
    seen = l > 0
    o = np.where(seen[:, None], o / np.where(seen, l, 1)[:, None], np.float32(0))
    lse = np.where(seen, m + np.log(np.where(seen, l, 1)), np.float32(-np.inf))
    uo = -(-(rows * d) // NT)
    eo = np.arange(uo)[:, None] * NT + np.arange(NT)[None, :]
    eo_c = np.minimum(eo, rows * d - 1)
    ov = o[eo_c // d, eo_c % d]  # (uo, NT)
    with t.where(unroll(uo) * NT + j < rows * d):
        O[q_off + row0 * d + unroll(uo) * NT + j] = ov
    lv = lse[np.minimum(np.arange(NT), rows - 1)]
    with t.where(j < rows):
        L[head * n_q + row0 + j] = lv


block_cols_g = [64]


def run_flash_kernel(q, k, v, causal=False, block_rows=64, block_cols=64):  # noqa: F811
    _check_inputs(q, k, v, block_rows, block_cols)
    *lead, n_q, d = q.shape
    n_k = k.shape[-2]
    heads = math.prod(lead)
    block_cols_g[0] = block_cols
    gpu = gs.GPU()
    Q = gpu.array("Q", q.reshape(heads, n_q, d))
    K = gpu.array("K", k.reshape(heads, n_k, d))
    V = gpu.array("V", v.reshape(heads, n_k, d))
    O = gpu.zeros("O", (heads, n_q, d))
    L = gpu.zeros("L", (heads, n_q))
    nt = min(1024, max(32, -(-n_k // 32) * 32))
    grid = (-(-n_q // block_rows), heads)
    gpu.launch(dense_lanes_kernel, grid, (nt,), Q, K, V, O, L, n_q, n_k, d, 1.0 / math.sqrt(d), bool(causal), block_rows)
    o = torch.from_numpy(O.numpy()).reshape(*lead, n_q, d)
    lse = torch.from_numpy(L.numpy()).reshape(*lead, n_q)
    return o, lse, gpu.report()
