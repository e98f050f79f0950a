"""The judge-side recognisers of known attention bugs (autograder/tests/diagnose.py), in-process.

1. The recognisers' correct variants agree with course.reference and torch autograd (float64).
2. For every value-level mutation of parts 2, 4 and 6 in instructor/mutations/, the mutant (the
   reference solution with that bug, imported here from a temp folder) is recognised: the diagnosis
   of its output contains the mutation's hint.
3. No false positives: noise on a correct output gets the concept hint, not a bug's name.
4. locate() names the ragged last block and the fully masked rows.
5. No false failures: a correct implementation written differently from the reference (other loop
   order, masks on every tile, D as an einsum, ceil-sized splits) passes the public checks.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from autograder.tests import diagnose as dg
from autograder.tests import probes as pb
from course.reference import attention_plain, attention_reference

ROOT = Path(__file__).resolve().parent.parent
MUTATIONS = ROOT / "instructor" / "mutations"



pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

def qkv(lead, nq, nk, d=16, seed=0, mult=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*lead, n, d, generator=g, dtype=torch.float64) for n in (nq, nk, nk))
    return (q * mult).to(dtype), k.to(dtype), v.to(dtype)


def tol_of(plain, ref, factor=2.0):
    finite = torch.isfinite(ref)
    return factor * (plain.double() - ref).abs()[finite].max().item() + 1e-6


@pytest.mark.parametrize("nq,nk,causal", [(113, 113, False), (113, 203, True), (203, 113, True)])
def test_variant_machinery_is_correct_when_no_bug_is_switched_on(nq, nk, causal):
    q, k, v = qkv((2,), nq, nk, dtype=torch.float64)
    o, lse = attention_reference(q, k, v, causal)
    mo, ml, _ = dg.masked_attention(q, k, v, dg._mask(nq, nk, causal), None)
    assert dg._dist(mo, o) < 1e-12 and dg._dist(ml, lse) < 1e-12
    for missing in ("acc", "l", "both", "inverted"):  # every rescaling variant is a bug, visibly
        ro, _ = dg.no_rescale_forward(q * 3, k, v, causal=causal, block_k=32, scale=None, missing=missing)
        assert dg._dist(ro, attention_reference(q * 3, k, v, causal)[0]) > 1e-3
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    do = torch.randn(2, nq, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad(attention_reference(*leaves, causal)[0], leaves, do)
    mine = dg.masked_backward(q, k, v, o, lse, do, dg._mask(nq, nk, causal), None, d_mode="ok")
    assert all(dg._dist(a, b) < 1e-12 for a, b in zip(mine, grads))
    # block_mask without switches is the plain causal mask
    assert torch.equal(dg.block_mask(nq, nk, causal=causal, block_q=64, block_k=32), dg._mask(nq, nk, causal))


def _mutant(tmp_path: Path, name: str):
    """Import the solutions package with mutation `name` applied, from tmp_path (a fresh package)."""
    spec = tomllib.loads((MUTATIONS / f"{name}.toml").read_text(encoding="utf-8"))
    pkg = tmp_path / f"mutant_{name}"
    shutil.copytree(ROOT / "solutions", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for edit in spec["edit"]:
        path = pkg / edit["file"]
        text = path.read_text(encoding="utf-8")
        assert text.count(edit["old"]) == 1, f"{name}: edit does not apply exactly once"
        path.write_text(text.replace(edit["old"], edit["new"]), encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        return spec, importlib.import_module(f"mutant_{name}.flash_forward"), \
            importlib.import_module(f"mutant_{name}.flash_backward"), \
            importlib.import_module(f"mutant_{name}.flash_decoding")
    finally:
        sys.path.remove(str(tmp_path))


# (mutation, inputs that expose it): the public tests' shapes.
FORWARD = {
    "forward_no_rescale": ((2,), 113, 113, False, 32, 32),
    "forward_no_rescale_l": ((2,), 113, 113, False, 32, 32),
    "forward_lse_missing_m": ((2,), 113, 113, False, 32, 32),
    "forward_lse_base2": ((2,), 113, 113, False, 32, 32),
    "forward_topleft_causal": ((2,), 113, 203, True, 32, 64),
    "forward_diagonal_block_skipped": ((2,), 203, 203, True, 64, 32),
    "forward_ragged_block_dropped": ((2,), 113, 113, False, 32, 32),
    "forward_missing_neginf_guard": ((2,), 203, 113, True, 64, 64),
}


@pytest.mark.parametrize("name", sorted(FORWARD))
def test_forward_mutants_are_recognised(tmp_path, name):
    spec, fwd, _, _ = _mutant(tmp_path, name)
    lead, nq, nk, causal, bq, bk = FORWARD[name]
    q, k, v = qkv(lead, nq, nk)
    o, lse = fwd.flash_forward(q, k, v, causal=causal, block_q=bq, block_k=bk)
    ref_o, ref_lse = attention_reference(q, k, v, causal)
    plain_o, plain_lse = attention_plain(q, k, v, causal)
    which, actual, ref, plain = ("o", o, ref_o, plain_o)
    if dg._dist(o, ref_o) <= tol_of(plain_o, ref_o):  # an lse-only bug
        which, actual, ref, plain = ("lse", lse, ref_lse, plain_lse)
    assert dg._dist(actual, ref) > tol_of(plain, ref), f"{name} is not visible on these inputs"
    hint = dg.diagnose_forward(actual, which, q, k, v, causal=causal, block_q=bq, block_k=bk, scale=None,
                               tol=tol_of(plain, ref))
    assert spec["hint"] in hint, hint


BACKWARD = {
    "backward_wrong_D": ((2,), 113, 113, False, 32, 32),
    "backward_dq_overwritten": ((2,), 113, 113, False, 32, 32),
    "backward_dk_overwritten": ((2,), 113, 203, True, 32, 64),
    "backward_missing_scale": ((2,), 113, 203, True, 32, 64),
    "backward_missing_neginf_guard": ((2,), 203, 113, True, 64, 32),
}


@pytest.mark.parametrize("name", sorted(BACKWARD))
def test_backward_mutants_are_recognised(tmp_path, name):
    spec, _, bwd, _ = _mutant(tmp_path, name)
    lead, nq, nk, causal, bq, bk = BACKWARD[name]
    q, k, v = qkv(lead, nq, nk)
    do = torch.randn(*lead, nq, 16, generator=torch.Generator().manual_seed(7))
    o64, lse64 = attention_reference(q, k, v, causal)
    grads = bwd.flash_backward(q, k, v, o64.float(), lse64.float(), do, causal=causal, block_q=bq, block_k=bk)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(attention_reference(*leaves, causal)[0], leaves, do.double())
    leaves32 = [t.clone().requires_grad_() for t in (q, k, v)]
    plain = torch.autograd.grad(attention_plain(*leaves32, causal)[0], leaves32, do)
    hints = []
    for which, a, r, p in zip(("dq", "dk", "dv"), grads, ref, plain):
        if dg._dist(a, r) > tol_of(p, r, 3.0):
            hints.append(dg.diagnose_backward(a, which, q, k, v, o64, lse64, do, causal=causal, block_q=bq,
                                              block_k=bk, scale=None, tol=tol_of(p, r, 3.0)))
    assert hints, f"{name} is not visible on these inputs"
    assert spec["hint"] in hints[0], hints


@pytest.mark.parametrize("name", ["decode_combine_average", "decode_combine_lse_max", "decode_segment_dropped"])
def test_decode_mutants_are_recognised(tmp_path, name):
    spec, _, _, dec = _mutant(tmp_path, name)
    q, k, v = qkv((2, 3), 1, 203, mult=40.0)
    o, lse = dec.flash_decode(q, k, v, 3)
    ref_o, ref_lse = attention_reference(q, k, v)
    plain_o, plain_lse = attention_plain(q, k, v)
    lengths = [t.shape[-2] for t, _ in dec.split_kv(k, v, 3)]
    which, actual, ref, plain = ("o", o, ref_o, plain_o)
    if dg._dist(o, ref_o) <= tol_of(plain_o, ref_o):
        which, actual, ref, plain = ("lse", lse, ref_lse, plain_lse)
    hint = dg.diagnose_decode(actual, which, q, k, v, seg_lengths=lengths, scale=None, tol=tol_of(plain, ref))
    assert spec["hint"] in hint, hint


def test_averaging_is_only_visible_on_peaked_inputs():
    """Why part 6 uses q × 40: on unit-scale inputs averaging 3 segments is off by only ~1e-2."""
    errs = {}
    for mult in (1.0, 40.0):
        q, k, v = qkv((2, 3), 1, 203, mult=mult, dtype=torch.float64)
        parts = [attention_reference(q, k[..., a:b, :], v[..., a:b, :]) for a, b in ((0, 68), (68, 136), (136, 203))]
        avg = torch.stack([p[0] for p in parts]).mean(0)
        errs[mult] = (avg - attention_reference(q, k, v)[0]).abs().max().item()
    assert errs[1.0] < 0.1 < errs[40.0]


def test_noise_gets_the_concept_hint_not_a_bug_name():
    q, k, v = qkv((2,), 113, 203)
    ref_o, ref_lse = attention_reference(q, k, v, True)
    # (noise of 1e-3 relative would look like a float16 step, which has its own hint)
    noisy = (ref_o + 5e-2 * torch.randn(ref_o.shape, generator=torch.Generator().manual_seed(3))).float()
    hint = dg.diagnose_forward(noisy, "o", q, k, v, causal=True, block_q=32, block_k=64, scale=None, tol=1e-5)
    assert hint.startswith(dg.HINT_FORWARD)
    do = torch.randn(2, 113, 16, generator=torch.Generator().manual_seed(4))
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    dq = torch.autograd.grad(attention_reference(*leaves, True)[0], leaves[0], do.double())[0]
    noisy_dq = (dq + 5e-2 * dq.abs().max() * torch.randn(dq.shape, generator=torch.Generator().manual_seed(5))).float()
    hint = dg.diagnose_backward(noisy_dq, "dq", q, k, v, ref_o, ref_lse, do, causal=True, block_q=32, block_k=64,
                                scale=None, tol=1e-5)
    assert hint.startswith(dg.HINT_BACKWARD)


def test_locate_names_the_ragged_block_and_the_masked_rows():
    exp = torch.zeros(2, 113, 4, dtype=torch.float64)
    act = exp.clone()
    act[1, 100:, 2] = 1.0
    where, tag = dg.locate(act, exp, tol=1e-6, row_dim=-2, n_rows=113, block=32)
    assert tag == "ragged" and "rows 100..112" in where and "ragged last Q block, rows 96..112" in where
    assert "leading index (1,)" in where
    act = exp.clone()
    act[:, :5] = float("nan")
    where, tag = dg.locate(act, exp, tol=1e-6, row_dim=-2, n_rows=113, block=32, masked_rows=list(range(10)))
    assert tag == "masked" and "rows 0..4" in where
    where, tag = dg.locate(exp, exp, tol=1e-6, row_dim=-2, n_rows=113, block=32)
    assert (where, tag) == ("", None)


def test_dist_treats_matching_infinities_as_equal_and_others_as_inf():
    a = torch.tensor([1.0, -math.inf, 2.0])
    assert dg._dist(a, a.clone()) == 0.0
    assert dg._dist(a, torch.tensor([1.0, 0.0, 2.0])) == math.inf
    assert dg._dist(torch.tensor([float("nan")]), torch.tensor([0.0])) == math.inf


# ---------------------------------------------------------------------------------------------------
# No false failures: a correct implementation written differently from the reference passes the
# checks of parts 2, 4 and 6 (run in-process here through a stand-in for the engine's `student`).

ALTERNATIVE = {
    "flash_forward.py": '''
import math
import torch


def flash_forward(q, k, v, causal=False, block_q=64, block_k=64, scale=None):
    # no pre-scaled q, a mask built for every tile, rows guarded with nan_to_num-free where()s
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    o = torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
    for i0 in range(0, nq, block_q):
        i1 = min(nq, i0 + block_q)
        m = torch.full(q.shape[:-2] + (i1 - i0,), float("-inf"), dtype=q.dtype)
        l = torch.zeros_like(m)
        acc = torch.zeros(q.shape[:-2] + (i1 - i0, v.shape[-1]), dtype=q.dtype)
        for j0 in range(0, nk, block_k):
            j1 = min(nk, j0 + block_k)
            if causal and j0 > i1 - 1 + nk - nq:
                break
            s = torch.matmul(q[..., i0:i1, :], k[..., j0:j1, :].transpose(-1, -2)) * scale
            if causal:
                keep = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None] + (nk - nq)
                s = torch.where(keep, s, torch.tensor(float("-inf"), dtype=q.dtype))
            m_new = torch.maximum(m, s.max(dim=-1).values)
            safe = torch.where(m_new == float("-inf"), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - safe[..., None])
            alpha = torch.exp(m - safe)
            l = alpha * l + p.sum(-1)
            acc = alpha[..., None] * acc + torch.matmul(p, v[..., j0:j1, :])
            m = m_new
        o[..., i0:i1, :] = torch.where(l[..., None] > 0, acc / l.clamp_min(1e-30)[..., None], torch.zeros_like(acc))
        lse[..., i0:i1] = torch.where(l > 0, m + torch.log(l.clamp_min(1e-30)), torch.full_like(l, float("-inf")))
    return o, lse
''',
    "flash_backward.py": '''
import math
import torch

from .flash_forward import flash_forward


def flash_backward(q, k, v, o, lse, do, causal=False, block_q=64, block_k=64, scale=None):
    # Q blocks outer (the other loop order), D as an einsum (a matmul the FLOP check allows)
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    D = torch.einsum("...nd,...nd->...n", do, o)
    L = torch.where(torch.isinf(lse), torch.full_like(lse, float("inf")), lse)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i0 in range(0, nq, block_q):
        i1 = min(nq, i0 + block_q)
        for j0 in range(0, nk, block_k):
            j1 = min(nk, j0 + block_k)
            if causal and j0 > i1 - 1 + nk - nq:
                break
            s = q[..., i0:i1, :] @ k[..., j0:j1, :].transpose(-1, -2) * scale
            p = torch.exp(s - L[..., i0:i1, None])
            if causal:
                keep = torch.arange(j0, j1)[None, :] <= torch.arange(i0, i1)[:, None] + (nk - nq)
                p = p * keep
            dv[..., j0:j1, :] += p.transpose(-1, -2) @ do[..., i0:i1, :]
            ds = p * (do[..., i0:i1, :] @ v[..., j0:j1, :].transpose(-1, -2) - D[..., i0:i1, None])
            dq[..., i0:i1, :] += ds @ k[..., j0:j1, :] * scale
            dk[..., j0:j1, :] += ds.transpose(-1, -2) @ q[..., i0:i1, :] * scale
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=64, block_k=64, scale=None):
        o, lse = flash_forward(q, k, v, causal, block_q, block_k, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (causal, block_q, block_k, scale)
        return o

    @staticmethod
    def backward(ctx, do):
        return (*flash_backward(*ctx.saved_tensors, do, *ctx.args), None, None, None, None)


def flash_attention(q, k, v, causal=False):
    return FlashAttentionFunction.apply(q, k, v, causal, 64, 64, None)
''',
    "flash_decoding.py": '''
import math
import torch


def split_kv(k, v, num_splits):
    n = k.shape[-2]
    size = -(-n // num_splits)  # ceil: the last segments may be empty
    return [(k[..., min(n, s * size):min(n, (s + 1) * size), :], v[..., min(n, s * size):min(n, (s + 1) * size), :])
            for s in range(num_splits)]


def attention_partial(q, k_seg, v_seg, scale):
    if k_seg.shape[-2] == 0:
        return torch.zeros(q.shape[:-1] + v_seg.shape[-1:], dtype=q.dtype), torch.full(q.shape[:-1], -math.inf, dtype=q.dtype)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k_seg.transpose(-1, -2) * scale
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]) @ v_seg, lse


def combine_partials(partials):
    m = partials[0][1]
    for _, lse in partials[1:]:
        m = torch.maximum(m, lse)
    base = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    total = sum(torch.exp(lse - base) for _, lse in partials)
    o = sum(torch.exp(lse - base)[..., None] * o_s for o_s, lse in partials)
    o = torch.where(total[..., None] > 0, o / total.clamp_min(1e-30)[..., None], torch.zeros_like(o))
    return o, torch.where(total > 0, base + torch.log(total.clamp_min(1e-30)), torch.full_like(total, -math.inf))


def flash_decode(q, k, v, num_splits, scale=None):
    return combine_partials([attention_partial(q, ks, vs, scale) for ks, vs in split_kv(k, v, num_splits)])
''',
}


class InProcessStudent:
    """The engine's `student` proxy, in-process: arguments are deep-copied as across the pipe."""

    def __init__(self, package: str) -> None:
        self.package = package

    def module(self, name: str):
        return importlib.import_module(f"{self.package}.{name}")

    def function(self, target: str):
        module, _, rest = target.partition(".")
        obj = self.module(module)
        for part in rest.split("."):
            obj = getattr(obj, part)
        return obj

    def call(self, target: str, *args, **kwargs):
        import copy

        return self.function(target)(*copy.deepcopy(args), **copy.deepcopy(kwargs))

    def scenario(self, target: str, **kwargs):
        import copy

        module, _, name = target.rpartition(".")
        return getattr(importlib.import_module(f"autograder.scenarios.{module}"), name)(self, **copy.deepcopy(kwargs))

    def with_timeout(self, seconds: float) -> "InProcessStudent":
        return self


@pytest.fixture(scope="module")
def alternative(tmp_path_factory):
    root = tmp_path_factory.mktemp("alt")
    pkg = root / "alternative_impl"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in ALTERNATIVE.items():
        (pkg / name).write_text(text)
    sys.path.insert(0, str(root))
    yield InProcessStudent("alternative_impl")
    sys.path.remove(str(root))


def _public(name: str):
    spec = importlib.util.spec_from_file_location(f"_public_{name}", ROOT / "autograder" / "tests" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")  # the part markers live in the grader
def test_an_alternative_correct_implementation_passes_parts_2_4_6(alternative):
    from autograder.tests import cases_part2 as c2
    from autograder.tests import cases_part4 as c4
    from autograder.tests import cases_part6 as c6

    p2, p4, p6 = (_public(n) for n in ("test_part2_flash_forward.py", "test_part4_flash_backward.py",
                                        "test_part6_flash_decoding.py"))
    for case in p2.VALUES:
        c2.check_forward_values(alternative, case)
    for case in p2.MASKED:
        c2.check_fully_masked_rows(alternative, case)
    for case in p2.TRACE:
        c2.check_forward_trace(alternative, case)
    for case in p4.VALUES:
        c4.check_backward_values(alternative, case)
    for case in p4.MASKED:
        c4.check_masked_rows_grads(alternative, case)
    for case in p4.TRACE:
        c4.check_backward_trace(alternative, case)
    for case in p4.FUNCTION:
        c4.check_function_grads(alternative, case)
    for case in p4.SAVES:
        c4.check_function_saves(alternative, case)
    for case in p4.GRADCHECK:
        c4.check_gradcheck(alternative, case)
    for case in p6.SPLITS:
        c6.check_split(alternative, case)
    for case in p6.PARTIAL:
        c6.check_partial(alternative, case)
    for case, lengths in p6.COMBINE:
        c6.check_combine(alternative, case, lengths)
    for case in p6.EMPTY:
        c6.check_combine_all_empty(alternative, case)
    for case in p6.DECODE:
        c6.check_decode(alternative, case)
    for case in p6.TRACE:
        c6.check_decode_trace(alternative, case)


# ---------------------------------------------------------------------------------------------------
# The invariant probes (autograder/tests/probes.py), in-process on the solutions and on mutants


class ModuleStudent:
    """student.call for the probes, in this process, on an imported package's modules."""

    def __init__(self, modules: dict):
        self.modules, self.hidden = modules, False

    def call(self, target, *args, **kwargs):
        module, name = target.split(".")
        # as in a worker (worker.main): torch.empty's memory is NaN, not what the allocator held, so a mutant
        # that never writes some rows fails the same rung every time
        on, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            return getattr(self.modules[module], name)(*args, **kwargs)
        finally:
            torch.use_deterministic_algorithms(on, warn_only=warn)


def _solutions_student():
    mods = {n: importlib.import_module(f"solutions.{n}") for n in
            ("online_softmax", "flash_forward", "flash_backward", "flash_decoding")}
    return ModuleStudent(mods)


def test_every_ladder_passes_on_the_solutions_and_says_so_neutrally():
    st = _solutions_student()
    findings = [pb.forward_ladder(st), pb.backward_ladder(st), pb.combine_ladder(st), pb.partial_ladder(st),
                pb.summary_ladder(st), pb.merge_ladder(st, "merge_summary"), pb.merge_ladder(st, "merge_partial")]
    findings += [pb.softmax_ladder(st, fn) for fn in ("naive_softmax", "safe_softmax", "online_softmax")]
    for f in findings:
        assert f.failed is None, f.message()
        assert f.message().startswith(pb.NEUTRAL)


@pytest.mark.parametrize("name,rung", [
    ("forward_no_rescale", "one Q block and 4 K/V blocks"),
    ("forward_topleft_causal", "causal with Nq < Nk"),
    ("forward_ragged_block_dropped", "a ragged last Q block"),
    ("forward_missing_neginf_guard", "causal with Nq > Nk"),
    ("forward_lse_base2", "one full tile"),
])
def test_the_forward_ladder_stops_at_the_rung_that_isolates_the_bug(tmp_path, name, rung):
    _, fwd, _, _ = _mutant(tmp_path, name)
    finding = pb.forward_ladder(ModuleStudent({"flash_forward": fwd}))
    assert finding.failed is not None and finding.failed.label.startswith(rung), finding.message()
    assert finding.message().startswith("correct with") or not finding.passed, finding.message()


@pytest.mark.parametrize("name,rung", [
    ("backward_dq_overwritten", "one Q block and 4 K/V blocks"),
    ("backward_dk_overwritten", "4 Q blocks and one K/V block"),
    ("backward_missing_scale", "one full tile"),
])
def test_the_backward_ladder_stops_at_the_rung_that_isolates_the_bug(tmp_path, name, rung):
    _, _, bwd, _ = _mutant(tmp_path, name)
    finding = pb.backward_ladder(ModuleStudent({"flash_backward": bwd}))
    assert finding.failed is not None and finding.failed.label.startswith(rung), finding.message()


def test_a_raising_probe_is_reported_not_raised():
    class Raises:
        hidden = False

        def call(self, target, *args, **kwargs):
            from autograder.engine.errors import StudentError
            raise StudentError("flash_forward raised IndexError: boom", kind="exception", target=target)
    finding = pb.forward_ladder(Raises())
    assert finding.raised and "raises with one full tile" in finding.message()


def test_the_console_lists_every_failing_test_with_a_one_line_reason():
    from autograder.engine.feedback import part_lines
    part = {"part": 2, "name": "x", "status": "failed", "passed": 1, "total": 3,
            "first_failure": {"test": "public/t::a", "message": "checked: o of flash_forward\nhint: h"}}
    tests = [{"id": "public/t::a", "part": 2, "set": "public", "outcome": "failed",
              "message": "checked: o of flash_forward\nhint: h"},
             {"id": "hidden test 1", "part": 2, "set": "hidden", "outcome": "failed", "message": "checked: secret"},
             {"id": "public/t::c", "part": 2, "set": "public", "outcome": "passed", "message": ""}]
    lines = part_lines(part, tests)
    assert "    failing tests (2):" in lines
    assert "      - public/t::a: o of flash_forward" in lines
    assert "      - hidden test 1" in lines  # hidden: the name only


def test_k_reshaped_instead_of_transposed_is_recognised():
    """An uncatalogued bug, kt = k.reshape(-1, d, Nk): the same numbers in another order. The recogniser names
    it (the probes could only say 'the math inside one tile')."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 16, 8, generator=g, dtype=torch.float64) for _ in range(3))
    kt = k.reshape(2, 8, 16)
    s = (q @ kt) / math.sqrt(8)
    o = torch.softmax(s, -1) @ v
    hint = dg.recognise_forward(o, "o", q, k, v, causal=False, block_q=16, block_k=16, scale=None, tol=1e-8)
    assert hint == dg.HINT_K_RESHAPED


@pytest.mark.parametrize("which", ["o", "lse"])
def test_a_forward_or_backward_that_leaves_out_whole_block_pairs_is_named(which):
    """Round 3's uncatalogued bugs: a causal skip that starts a loop at the wrong block was answered with the
    alignment rung's guess. Any set of whole (Q block, K/V block) pairs left out is fitted (per Q block the
    kept K/V blocks; per block of gradient rows the pairs' shares) and named, with the pairs; the correct
    result fits nothing."""
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(2, 64, 8, generator=g, dtype=torch.float64) for _ in range(4))
    o, lse, _ = dg.masked_attention(q, k, v, dg._mask(64, 64, True), None)
    allowed = dg._mask(64, 64, True).clone()
    allowed[32:48, 0:16] = False  # Q block 2 never meets K/V block 0
    o2, lse2, _ = dg.masked_attention(q, k, v, allowed, None)
    kw = dict(causal=True, block_q=16, block_k=16, scale=None, tol=1e-9)
    said = dg.recognise_forward(o2 if which == "o" else lse2, which, q, k, v, **kw)
    assert said and "leaves out 1 (Q block, K/V block) pair (rows 32..47 with keys 0..15)" in said, said
    assert dg.recognise_forward(o if which == "o" else lse, which, q, k, v, **kw) is None
    grads = dg.masked_backward(q, k, v, o, lse, do, allowed, None, d_mode="ok")
    said = dg.recognise_backward(grads[0], "dq", q, k, v, o, lse, do, **kw)
    assert said and "leaves out 1 (Q block, K/V block) pair (rows 32..47 with keys 0..15)" in said, said
