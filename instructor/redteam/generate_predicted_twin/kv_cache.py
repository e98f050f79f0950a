# ---- red-team attack (instructor/redteam): everything below is the attack ----
# generate() with no cache and no recorded model call at all:
# 1. sys._getframe(1) is the scenario (autograder/scenarios/part5.generate): its `xs` hold EVERY batch of
#    the test, so the first call knows the whole test.
# 2. The test's seed is recovered from the prompts (likesworld.make_prompts / test examples are seeded
#    with small ints); the twin's prompts are then what cases_part5.twin_prompts draws from the same
#    seed (test_examples(seed * 1000 + draw)), so the worker knows the twin's inputs too.
# 3. The course's uncached greedy_generate runs in a new thread (dispatch modes are thread-local: not
#    recorded) on the real prompts and on the twin's.
# 4. The new tokens of both enter as slices of one arange (SymInt indices: no constant, no scalar), and
#    an indicator computed from the prompt tensor picks the recorded answer or the twin's.
import sys as _sys  # noqa: E402
import threading as _th  # noqa: E402

from course import likesworld as _lw  # noqa: E402
from course.tiny_transformer import greedy_generate as _greedy  # noqa: E402

_PLAN: dict = {}


def _off_record(fn):
    box = {}

    def run():
        with torch.no_grad():
            box["v"] = fn()

    th = _th.Thread(target=run)
    th.start()
    th.join()
    return box["v"]


def _examples(seed, n=400):
    return tuple(e.tokens for e in _lw.examples("test", n, seed=seed))


def _test_seed(batches):
    p0 = batches[0][0]
    for s in range(1000):  # check_generate: likesworld.make_prompts(n, seed)
        if list(_lw.make_prompts(1, s)[0]) == p0:
            return s
    if len(batches) == 1:  # check_generate_batched: example_tokens(seed, batch, 12)[:, :12]
        b = len(batches[0])
        for s in range(600):
            exs = _examples(s)
            for first in exs:
                if len(first) >= 12:
                    same = [list(t[:12]) for t in exs if len(t) == len(first)][:b]
                    if len(same) == b and same == batches[0]:
                        return s
                    break
    return None


def _greedy_gap(model, rows, new):
    tokens, gap = torch.tensor(rows, dtype=torch.long), float("inf")
    for _ in range(new):
        logits = model(tokens)[:, -1]
        top = logits.topk(2, dim=-1).values
        gap = min(gap, float((top[:, 0] - top[:, 1]).min()))
        tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], dim=1)
    return tokens.tolist(), gap


def _twin(model, shapes, new, seed):
    for draw in range(1, 6):
        examples = _examples(seed * 1000 + draw)
        batches = []
        for b, t0 in shapes:
            rows = [list(e[:t0]) for e in examples if len(e) > t0]
            if len(rows) < b:
                break
            batches.append(rows[:b])
        else:
            if all(_greedy_gap(model, rows, new)[1] >= 1e-4 for rows in batches):
                return batches
    return None


def _plan(model, xs, new):
    batches = [x.tolist() for x in xs]
    main = [_greedy(model, x.clone(), new).tolist() for x in xs]
    seed = _test_seed(batches)
    twin = _twin(model, [tuple(x.shape) for x in xs], new, seed) if seed is not None else None
    twin_out = [_greedy_gap(model, rows, new)[0] for rows in twin] if twin is not None else None
    return {"main": main, "twin": twin, "twin_out": twin_out, "batches": batches}


def _smuggle(values, base):
    return torch.cat([base[i:i + 1] for i in values])


def generate(model, prompt, max_new_tokens, use_cache=True, attention=None):
    frame = _sys._getframe(1)
    xs = frame.f_locals.get("xs") or [prompt]
    key = (id(xs), max_new_tokens)
    if _PLAN.get("key") != key:
        _PLAN.clear()
        _PLAN.update(key=key, plan=_off_record(lambda: _plan(model, [x.detach().clone() for x in xs], max_new_tokens)))
    plan = _PLAN["plan"]
    n = next(i for i, x in enumerate(xs) if x is prompt)
    b, t0 = prompt.shape
    base = torch.arange(max(max(r) for rows in plan["main"] + (plan["twin_out"] or []) for r in rows) + 1)
    main_new = [t for r in plan["main"][n] for t in r[t0:]]
    new = _smuggle(main_new, base).double()
    if plan["twin"] is not None:
        twin_new = [t for r in plan["twin_out"][n] for t in r[t0:]]
        pos = next(((r, c) for r in range(b) for c in range(t0)
                    if plan["batches"][n][r][c] != plan["twin"][n][r][c]), None)
        if pos is not None:
            p, q = plan["batches"][n][pos[0]][pos[1]], plan["twin"][n][pos[0]][pos[1]]
            t = (prompt[pos[0], pos[1]].double() - p) / (q - p)  # 0 on these prompts, 1 on the twin's
            new = new + t * (_smuggle(twin_new, base).double() - new)
    return torch.cat([prompt, (new + 0.5).floor().long().view(b, max_new_tokens)], dim=1)
