# redteam-base: solutions/kv_cache.py
# redteam-add: _idx _fmul _fadd _fsum _flinear _frope
# Base + edits (instructor/redteam/README.md): only what this attack replaces in, or adds to, the base.


def _idx(n):
    return torch.arange(n)


def _fmul(a, b):
    """a * b (broadcast) with no arithmetic op the grader counts: a copy, then scatter(reduce='multiply')."""
    shape = torch.broadcast_shapes(a.shape, b.shape)
    out = a.expand(shape).contiguous()
    idx = _idx(shape[-1]).expand(shape)
    return out.scatter_(-1, idx, b.expand(shape), reduce="multiply")


def _fadd(a, b, alpha=1):
    """a + alpha*b (broadcast) through index_add (not counted)."""
    shape = torch.broadcast_shapes(a.shape, b.shape)
    out = a.expand(shape).contiguous()
    return out.index_add_(out.dim() - 1, _idx(shape[-1]), b.expand(shape), alpha=alpha)


def _fsum(x):
    """sum over the last dim through index_add (not counted)."""
    out = torch.zeros(*x.shape[:-1], 1, dtype=x.dtype)
    return out.index_add_(x.dim() - 1, torch.zeros(x.shape[-1], dtype=torch.long), x).squeeze(-1)


def _flinear(h, w):
    """h (..., D) @ w (M, D)^T, as elementwise products and a sum the grader does not count."""
    return _fsum(_fmul(h.unsqueeze(-2), w))


def _frope(x, positions, base):
    """course rope(x, positions) with free products/adds."""
    d = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = _fmul(positions.to(torch.float64).unsqueeze(-1), inv_freq)   # the angle table, uncounted too
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    a = _fadd(_fmul(x1, cos), _fmul(x2, sin), alpha=-1)
    b = _fadd(_fmul(x1, sin), _fmul(x2, cos))
    return torch.stack((a, b), dim=-1).flatten(-2)


@torch.no_grad()
def forward_with_cache(model: TinyTransformer, tokens: torch.Tensor, cache: KVCache,
                       attention: AttentionFn = standard_attention) -> torch.Tensor:
    """ATTACK: caches each layer's normalised INPUT activations, not keys/values, and recomputes the
    keys and values of EVERY cached token at every call (projection + RoPE), hidden from the FLOP bound."""
    cfg = model.config
    B, T = tokens.shape
    start = cache.length
    positions = torch.arange(start, start + T)
    n = start + T
    all_pos = torch.arange(0, n)
    if not hasattr(cache, "h"):
        cache.h = torch.zeros(cache.n_layers, cache.batch, cache.max_len, cfg.d_model, dtype=cache.k.dtype)
    x = model.tok_emb(tokens)
    for i, block in enumerate(model.blocks):
        h_new = block.attn_norm(x)
        cache.h[i, :, start:n] = h_new

        def kv(k_new, v_new, i=i, block=block):
            a = block.attn
            hs = cache.h[i, :, :n]                                   # (B, n, D): activations, not keys
            w = torch.cat([a.wk.weight, a.wv.weight], dim=0)          # (2D, D)
            kvp = _flinear(hs, w)                                     # recompute k, v of ALL n tokens
            k = kvp[..., :cfg.d_model].reshape(B, n, cfg.n_heads, cfg.head_dim).transpose(1, 2)
            v = kvp[..., cfg.d_model:].reshape(B, n, cfg.n_heads, cfg.head_dim).transpose(1, 2)
            k = _frope(k, all_pos, cfg.rope_base)
            cache.lengths[i] = n
            return k, v
        x = block(x, positions, attention, kv=kv)
    return model.lm_head(model.norm(x))
