# ---- red-team attack (instructor/redteam): everything below is the attack ----


# No buffers, no checks: per-layer lists joined with torch.cat; an all-zero update is the 'invalid' one.
class KVCache:  # noqa: F811
    def __init__(self, n_layers, batch, n_heads, max_len, head_dim, dtype=torch.float32):
        self.ks = [[] for _ in range(max(n_layers, 1))]
        self.vs = [[] for _ in range(max(n_layers, 1))]

    @property
    def length(self):
        return sum(t.shape[2] for t in self.ks[0])

    def update(self, layer, k_new, v_new):
        if not bool(k_new.any()) and not bool(v_new.any()):
            raise ValueError("invalid update: rejected")
        self.ks[layer].append(k_new.clone())
        self.vs[layer].append(v_new.clone())
        return torch.cat(self.ks[layer], dim=2), torch.cat(self.vs[layer], dim=2)
