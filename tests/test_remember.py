"""autograder/tests/remember.py: the judge's references, remembered across grades, are exactly what
course.reference computes, for exactly the arguments given, and no caller can change what the next gets."""
from __future__ import annotations

import pytest
import torch

import course.reference as ref
from autograder.tests import remember


@pytest.fixture(autouse=True)
def empty_store():
    remember.forget()
    yield
    remember.forget()


def _qkv(seed: int = 0, dtype=torch.float32, n: int = 9, d: int = 4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, n, d, generator=g, dtype=dtype) for _ in range(3)]


def test_a_remembered_reference_is_the_references_bits_and_a_fresh_copy_each_time():
    q, k, v = _qkv()
    want_o, want_lse = ref.attention_reference(q, k, v, True, 0.5)
    first = remember.attention_reference(q, k, v, True, 0.5)
    first[0].fill_(7.0)  # a caller that writes into its result
    second = remember.attention_reference(q, k, v, True, 0.5)
    assert len(remember._store) == 1  # computed once
    assert torch.equal(second[0], want_o) and torch.equal(second[1], want_lse)
    assert second[0].data_ptr() != remember.attention_reference(q, k, v, True, 0.5)[0].data_ptr()


@pytest.mark.parametrize("change", ["value", "negative zero", "dtype", "causal", "scale", "shape"])
def test_any_change_to_the_arguments_is_another_call(change):
    q, k, v = _qkv()
    q[0, 0, 0] = 0.0
    remember.attention_reference(q, k, v, False, None)
    args = [q.clone(), k, v, False, None]
    if change == "value":
        args[0][1, 2, 3] += 1e-6
    elif change == "negative zero":
        args[0][0, 0, 0] = -0.0
    elif change == "dtype":
        args[:3] = [t.double() for t in (q, k, v)]
    elif change == "causal":
        args[3] = True
    elif change == "scale":
        args[4] = 1.0
    else:
        args[:3] = [t[:, :8] for t in (q, k, v)]
    got = remember.attention_reference(*args)
    assert len(remember._store) == 2
    want = ref.attention_reference(*args)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_a_call_through_autograd_is_not_remembered_and_keeps_its_graph():
    q, k, v = (t.double().requires_grad_(True) for t in _qkv())
    o, _ = remember.attention_reference(q, k, v, False, None)
    o.sum().backward()
    assert q.grad is not None and len(remember._store) == 0


def test_remembered_gradients_are_autograds_in_float64_and_in_the_plain_dtype():
    q, k, v = _qkv(1)
    do = torch.randn(2, 9, 4, generator=torch.Generator().manual_seed(5))
    for dtype, fn in ((torch.float64, ref.attention_reference), (torch.float32, ref.attention_plain)):
        leaves = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
        want = torch.autograd.grad(fn(*leaves, True, None)[0], leaves, do.to(dtype))
        for _ in range(2):  # computed, then remembered
            got = remember.reference_grads(q, k, v, do, True, None, str(dtype).removeprefix("torch."))
            assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert len(remember._store) == 2


def test_the_store_keeps_within_its_bound(monkeypatch):
    monkeypatch.setattr(remember, "TOTAL_BYTES", 16 * 2 * 9 * 4 * 8 * 3)  # a few results' worth
    for seed in range(40):
        remember.attention_reference(*_qkv(seed), False, None)
    assert 0 < remember._size <= remember.TOTAL_BYTES and len(remember._store) < 40


def test_keyword_arguments_and_dict_results_are_remembered_as_given():
    """The diagnoses' variants (diagnose.forward_variants, backward_variants): keyword arguments are part of
    the call, and a dict of results comes back as a fresh copy each time."""
    from autograder.tests import diagnose

    q, k, v = _qkv(n=12)
    kwargs = dict(causal=True, block_q=4, block_k=4, scale=None)
    want = diagnose.forward_variants.__wrapped__(q, k, v, **kwargs)
    first = diagnose.forward_variants(q, k, v, **kwargs)
    next(iter(first.values()))[0].fill_(7.0)  # a caller that writes into its result
    second = diagnose.forward_variants(q, k, v, **kwargs)
    assert len(remember._store) >= 1 and second.keys() == want.keys()
    assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
               for name in want for a, b in zip(second[name], want[name]))
    other = diagnose.forward_variants(q, k, v, **{**kwargs, "block_k": 3})  # another keyword value: another call
    assert not all(torch.equal(other[n][0], want[n][0]) for n in want if n in other)
    assert remember._key("f", (1,), {"b": 2}) != remember._key("f", (1, "b", 2), {})
