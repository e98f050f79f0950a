"""Wrong outputs are the student's mistake: a failed test with one line that names it, never a grading error.

A buggy (not hostile) submission returns odd values: a bool or integer tensor, a 0-d tensor, segments
with too few dims, a cache length that is a tensor of several lengths, a complex or float16 value on
the simulated GPU. The checks validate each value where it enters them (type, dtype, shape:
engine/checks.check_tensor) before they compute with it, so such a test FAILS with a message naming
the broken invariant. A check that computed first (`.abs()` of a bool tensor, `t.shape[-1]` of a 0-d
one, the truth of a tensor of several lengths) made the test an "error": a judge error that puts the
whole submission on the instructor's regrade list instead of grading it.

Each case grades one variant of the solutions (one function wrapped to return the odd value) with the
REAL checks of cases_partN on one small input (a mini tests folder, public set only), so a case costs
one worker start and a call or two; the solutions pass the same mini tests.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autograder.engine import grade

ROOT = Path(__file__).resolve().parent.parent

MINI = {
    1: '''
from autograder.tests import cases_part1 as C

def test_naive_softmax(student):
    C.check_softmax(student, "naive_softmax", C.RowsCase((4, 13), "float32", seed=0))
''',
    2: '''
from autograder.tests import cases_part2 as C

def test_fully_masked_rows(student):
    C.check_fully_masked_rows(student, C.AttnCase((2,), 13, 7, 4, causal=True, block_q=4, block_k=4))
''',
    4: '''
from autograder.tests import cases_part4 as C
from autograder.tests.cases_part2 import AttnCase

def test_backward_fully_masked_rows(student):
    C.check_masked_rows_grads(student, AttnCase((1,), 9, 7, 4, causal=True, block_q=4, block_k=3))
''',
    5: '''
from autograder.tests import cases_part5 as C

def test_cache_update_and_length(student):
    C.check_cache_unit(student, C.UnitCase())

def test_cached_logits_every_step(student):
    C.check_cached_logits(student, C.CacheCase((5, 1)))
''',
    6: '''
from autograder.tests import cases_part6 as C

def test_split_kv(student):
    C.check_split(student, C.DecodeCase((), 1, 5, 4, 2))  # 2-d k and v: a 0-d segment has no dim -1

def test_combine_all_empty(student):
    C.check_combine_all_empty(student, C.DecodeCase((), 1, 0, 8))
''',
}
FILES = {1: "online_softmax.py", 2: "flash_forward.py", 4: "flash_backward.py", 5: "kv_cache.py",
         6: "flash_decoding.py"}


def _wrap(fn: str, body: str) -> str:
    """Source appended to a solution file: `fn` now returns `body` of the solution's result r."""
    return f"\n\n_right_{fn} = {fn}\n\n\ndef {fn}(*a, **kw):\n    r = _right_{fn}(*a, **kw)\n    return {body}\n"


_MULTI_LENGTH = '''

KVCache.length = property(lambda self: torch.tensor(self.lengths))  # every layer's length, as a tensor


@torch.no_grad()
def forward_with_cache(model, tokens, cache, attention=standard_attention):  # reads layer 0's length itself
    positions = torch.arange(cache.lengths[0], cache.lengths[0] + tokens.shape[1])
    x = model.tok_emb(tokens)
    for i, block in enumerate(model.blocks):
        x = block(x, positions, attention, kv=lambda k, v, i=i: cache.update(i, k, v))
    return model.lm_head(model.norm(x))
'''

# variant -> (part, source appended to the part's solution, {test: what its one-line message must say})
VARIANTS = {
    # these made a judge error (grading error) before the checks validated their values
    "forward_o_bool": (2, _wrap("flash_forward", "(r[0] > 0, r[1])"),
                       {"test_fully_masked_rows": "dtype bool, expected float32"}),
    "backward_dq_bool": (4, _wrap("flash_backward", "(r[0] > 0, r[1], r[2])"),
                         {"test_backward_fully_masked_rows": "dtype bool, expected float32"}),
    "split_kv_0d_segments": (6, _wrap("split_kv", "[(a.sum(), b) for a, b in r]"),
                             {"test_split_kv": "k is (5, 4) float32; segments: () float32, () float32"}),
    "cache_length_of_every_layer": (5, _MULTI_LENGTH, {
        "test_cached_logits_every_step": "cache.length must be a Python int",
        "test_cache_update_and_length": "cache.length must be a Python int"}),
    # these passed a test with a wrong dtype or shape (the test computed on the values without checking them)
    "forward_o_int64": (2, _wrap("flash_forward", "(r[0].to(torch.int64), r[1])"),
                        {"test_fully_masked_rows": "dtype int64, expected float32"}),
    "backward_dv_0d": (4, _wrap("flash_backward", "(r[0], r[1], r[2].sum())"),
                       {"test_backward_fully_masked_rows": "shape (), expected (1, 7, 4)"}),
    "combine_o_0d": (6, _wrap("combine_partials", "(r[0].sum(), r[1])"),
                     {"test_combine_all_empty": "shape (), expected (1, 8)"}),
    "cache_length_float": (5, "\n\nKVCache.length = property(lambda self: float(self.lengths[0]))\n", {
        "test_cached_logits_every_step": "cache.length must be a Python int (tokens cached in layer 0), got a float 5.0",
        "test_cache_update_and_length": "got a float 3.0"}),
    # the replay names a dtype it has no tensors of, and a value it cannot rebuild
    "softmax_complex": (1, _wrap("naive_softmax", "r.to(torch.complex64)"),
                        {"test_naive_softmax": "the call used the dtype complex64"}),
    "softmax_generator": (1, _wrap("naive_softmax", "(x for x in r)"),
                          {"test_naive_softmax": "returned a generator, which is not a tensor"}),
}


@pytest.fixture(scope="module")
def mini_tests(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wrong-outputs-tests")
    for part, text in MINI.items():
        (folder / f"test_part{part}_wrong_outputs.py").write_text(f"import pytest\n\npytestmark = pytest.mark.part{part}\n"
                                                                f"{text}")
    return folder


def _graded(impl: Path, parts: list[int], tests: Path) -> dict:
    report = grade(impl, parts=parts, test_sets=("public",), tests_dir=tests)
    assert not report["judge_errors"] and not report["errors"], (report["judge_errors"], report["errors"])
    return report


def test_the_solutions_pass_the_mini_tests(tmp_path, mini_tests):
    report = _graded(ROOT / "solutions", sorted(MINI), mini_tests)
    bad = [(t["id"], t["message"]) for t in report["tests"] if t["outcome"] != "passed"]
    assert not bad and len(report["tests"]) == 7


@pytest.mark.parametrize("name", VARIANTS)
def test_a_wrong_output_fails_its_test_with_one_line_naming_it(tmp_path, mini_tests, name):
    part, source, expected = VARIANTS[name]
    impl = tmp_path / "impl"
    shutil.copytree(ROOT / "solutions", impl)
    (impl / FILES[part]).write_text((impl / FILES[part]).read_text() + source)
    report = _graded(impl, [part], mini_tests)  # no judge error, no grading error
    outcomes = {t["id"].split("::")[-1]: t for t in report["tests"]}
    for test, says in expected.items():
        t = outcomes[test]
        assert t["outcome"] == "failed", (test, t["outcome"], t["message"])
        assert says in t["message"], (test, t["message"])
