# ---- red-team attack (instructor/redteam): everything below is the attack ----


# No cache at all. The error test only asked whether the update AFTER the prefill raises a ValueError
# with a one-line message, so every update after the first n_layers ones raises.
class KVCache:  # noqa: F811
    def __init__(self, n_layers, batch, n_heads, max_len, head_dim, dtype=torch.float32):
        self._calls, self._layers = 0, n_layers

    @property
    def length(self):
        return 0

    def update(self, layer, k_new, v_new):
        self._calls += 1
        if self._calls > self._layers:
            raise ValueError("invalid update: check the layer, the shapes and max_len")
        return k_new, v_new
