# ---- red-team attack (instructor/redteam): everything below is the attack ----
# 1. The answer is computed where the recorder cannot see it: in a new thread (dispatch modes are
#    thread-local), as dense float64 attention.
# 2. The twin's inputs are predictable: replay.perturbed() seeds torch.Generator with
#    (case.seed + 1) * 1000 + i, and case.seed is recovered from k (torch.randn from a small seed).
#    So the answer for the twin is computed off the record too.
# 3. Both answers enter through nan_to_num(nan=, posinf=, neginf=): float? arguments, which the
#    judge's scalar budget does not count (it counts only "Scalar"/"number" arguments).
# 4. An indicator t = (q[i] - q_main[i]) / (q_twin[i] - q_main[i]) (0 on the recorded inputs, 1 on
#    the twin's) picks the answer; dummy tile matmuls give the exact matmul FLOPs.
import threading as _th


def _perturbed(t, seed, rel=5e-2):
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(t.shape, generator=g, dtype=torch.float64) * 2 - 1
    out = t.double() * (1 + rel * u)
    out = torch.where(torch.isfinite(t), out, t.double())
    return out.to(t.dtype)


def _dense(q, k, v, causal, scale):
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        nq, nk = s.shape[-2:]
        s = s.masked_fill(~torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)[..., None])
    return p @ v, lse


def _find_seed(q, k):
    lead, nq, d, nk = q.shape[:-2], q.shape[-2], q.shape[-1], k.shape[-2]
    for s in range(3000):
        g = torch.Generator().manual_seed(s)
        torch.randn(*lead, nq, d, generator=g, dtype=torch.float64)
        kk = torch.randn(*lead, nk, d, generator=g, dtype=torch.float64).to(k.dtype)
        if torch.equal(kk, k):
            return s
    return None


def _offline(q, k, v, causal, scale):
    out = {}

    def work():
        with torch.no_grad():
            qd, kd, vd = q.detach().clone(), k.detach().clone(), v.detach().clone()
            o, lse = _dense(qd, kd, vd, causal, scale)
            o, lse = o.to(q.dtype), lse.to(q.dtype)
            s = _find_seed(qd, kd)
            if s is None:
                to, tl, qi = o, lse, None
            else:
                seed = s + 1
                tq, tk, tv = (_perturbed(t, seed * 1000 + i) for i, t in enumerate((qd, kd, vd), 1))
                to, tl = _dense(tq, tk, tv, causal, scale)
                to, tl = to.to(q.dtype), tl.to(q.dtype)
                diff = (tq != qd).reshape(-1).nonzero()
                qi = int(diff[0]) if len(diff) else None
                out["a"], out["b"] = (float(qd.reshape(-1)[qi]), float(tq.reshape(-1)[qi])) if qi is not None else (0, 0)
            do = torch.where(torch.isfinite(o), to - o, torch.zeros_like(o))
            dl = torch.where(torch.isfinite(lse), tl - lse, torch.zeros_like(lse))
            out.update(qi=qi, vals=[x.reshape(-1).tolist() for x in (o, do, lse, dl)],
                       shapes=[tuple(o.shape), tuple(lse.shape)])

    th = _th.Thread(target=work)
    th.start()
    th.join()
    return out


def _smuggle(values, dtype):
    """A recorded tensor holding `values`, three numbers per nan_to_num op."""
    base = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=dtype)
    vals = list(values) + [0.0] * (-len(values) % 3)
    parts = [base.nan_to_num(nan=vals[i], posinf=vals[i + 1], neginf=vals[i + 2]) for i in range(0, len(vals), 3)]
    return torch.cat(parts)[: len(values)]


def _dummy_flops(q, k, v, causal, block_q, block_k):
    nq, nk = q.shape[-2], k.shape[-2]
    for i0 in range(0, nq, block_q):
        i1 = min(i0 + block_q, nq)
        k_end = max(0, min(nk, i1 + nk - nq)) if causal else nk
        for j0 in range(0, k_end, block_k):
            j1 = min(j0 + block_k, nk)
            s = q[..., i0:i1, :] @ k[..., j0:j1, :].transpose(-2, -1)
            s @ v[..., j0:j1, :]


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    got = _offline(q, k, v, causal, scale)
    o_shape, l_shape = got["shapes"]
    o0, do, l0, dl = (_smuggle(x, q.dtype) for x in got["vals"])
    _dummy_flops(q, k, v, causal, block_q, block_k)
    if got["qi"] is None:
        return o0.reshape(o_shape), l0.reshape(l_shape)
    t = (q.reshape(-1)[got["qi"]] - got["a"]) / (got["b"] - got["a"])  # 0 here, 1 on the twin's inputs
    return (o0 + t * do).reshape(o_shape), (l0 + t * dl).reshape(l_shape)
