"""course/tiny_transformer.py: shapes, RoPE, attention conventions, determinism, the checkpoint."""

from __future__ import annotations

import pytest
import torch

from course import likesworld
from course.reference import attention_reference
from course.tiny_transformer import (
    CHECKPOINT,
    ModelConfig,
    TinyTransformer,
    decoding_attention,
    greedy_generate,
    load_checkpoint,
    make_model,
    rope,
    standard_attention,
    train,
)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    return load_checkpoint()


def test_shapes_and_parameter_count():
    m = make_model(0)
    cfg = m.config
    assert (cfg.n_layers, cfg.n_heads, cfg.head_dim, cfg.d_model) == (2, 4, 16, 64)
    # per layer: 4·64² attention + 3·64·128 SwiGLU + 2·64 norms; embeddings and lm_head 30·64 each; final norm 64
    expected = 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 2 * likesworld.VOCAB_SIZE * 64 + 64
    assert m.num_params() == expected == 86_080, "about 85K parameters (§2.2)"
    tokens = torch.randint(0, cfg.vocab_size, (3, 11))
    assert m(tokens).shape == (3, 11, cfg.vocab_size)
    assert isinstance(m.blocks, torch.nn.ModuleList) and len(m.blocks) == 2
    with pytest.raises(ValueError, match=r"\(B, T\) long"):
        m(tokens.float())


def test_make_model_is_seeded():
    a, b, c = make_model(0), make_model(0), make_model(1)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)


def test_rope_depends_only_on_relative_position():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 1, 16, generator=g, dtype=torch.float64)
    dots = [float((rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum()) for m, n in ((5, 2), (13, 10), (40, 37))]
    assert max(dots) - min(dots) < 1e-12, f"q·k after RoPE depends on m - n only: {dots}"
    other = float((rope(q, torch.tensor([6])) * rope(k, torch.tensor([2]))).sum())
    assert abs(other - dots[0]) > 1e-3, "...and does depend on m - n"
    assert torch.allclose(rope(q, torch.tensor([0])), q), "position 0 is the identity"
    assert torch.allclose(rope(q, torch.tensor([7])).norm(), q.norm()), "a rotation keeps the norm"


@pytest.mark.parametrize("nq,nk", [(5, 5), (3, 9), (9, 3)])
def test_standard_attention_is_bottom_right_causal(nq, nk):
    g = torch.Generator().manual_seed(nq * 10 + nk)
    q, k, v = (torch.randn(2, 4, n, 16, generator=g, dtype=torch.float64) for n in (nq, nk, nk))
    o_ref, _ = attention_reference(q, k, v, causal=True)
    o = standard_attention(q, k, v, causal=True)
    assert not o.isnan().any(), "fully masked rows (nq > nk) give 0, not NaN"
    assert (o - o_ref).abs().max() < 1e-12


def test_causal_model_ignores_future_tokens(model):
    x = torch.tensor([likesworld.encode("<bos> eve likes tea . dan likes jam . q dan jam .")])
    y = x.clone()
    y[0, 8:] = likesworld.STOI["corn"]
    assert torch.equal(model(x)[:, :8], model(y)[:, :8])


def test_deterministic_training():
    """Two runs of a few steps from the same seed give bit-identical weights and losses."""
    runs = []
    for _ in range(2):
        m = make_model(0)
        losses = train(m, steps=4, batch_size=8, easy_steps=2)
        runs.append((losses, m.state_dict()))
    (la, sa), (lb, sb) = runs
    assert la == lb, "identical losses"
    assert all(torch.equal(sa[k], sb[k]) for k in sa), "bit-identical weights"
    assert not torch.equal(sa["tok_emb.weight"], make_model(0).tok_emb.weight), "training changed the weights"


def test_checkpoint_answers_every_held_out_question(model):
    acc = likesworld.evaluate(model, "test")
    base = likesworld.random_item_baseline("test")
    print(f"checkpoint: test accuracy {acc:.1%} (held-out worlds), random-item baseline {base:.1%}")
    assert acc == 1.0, f"the committed checkpoint answers {acc:.2%} of the held-out questions, not 100%"
    assert CHECKPOINT.stat().st_size < 1_000_000, "a few hundred KB"


def test_checkpoint_generates_the_format(model):
    prompt = torch.tensor([likesworld.encode("<bos> eve likes tea . dan likes jam . hal likes figs . q hal")])
    out = likesworld.decode(greedy_generate(model, prompt, 2)[0])
    assert out.endswith("q hal figs ."), out


def test_load_checkpoint_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m course.tiny_transformer train"):
        load_checkpoint(tmp_path / "none.pt")


def test_decoding_attention_switches_on_one_query():
    calls = []

    def decode(q, k, v, num_splits):
        calls.append(num_splits)
        return standard_attention(q, k, v, causal=False), None

    attn = decoding_attention(decode, 3)
    q, k, v = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    attn(q, k, v, True)
    attn(torch.randn(1, 2, 6, 4), k, v, True)
    assert calls == [3], "Flash-Decoding for a 1-query step only; the prefill uses the other function"
