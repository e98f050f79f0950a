"""course/likesworld.py: the §2.2 format, the held-out split, the baseline and the prompts."""

from __future__ import annotations

import random

import pytest

from course import likesworld as lw


def test_example_in_the_notes_format():
    e = lw.make_example(random.Random(0), "train")
    words = lw.decode(e.tokens).split()
    assert words[0] == "<bos>" and words[-1] == "<eos>"
    facts = words[1: 1 + 4 * e.n_items]
    for f in range(e.n_items):                    # "<person> likes <item> ."
        p, likes, item, dot = facts[4 * f: 4 * f + 4]
        assert p in lw.PEOPLE and likes == "likes" and item in lw.ITEMS and dot == "."
    owner = {facts[4 * f]: facts[4 * f + 2] for f in range(e.n_items)}
    for i in e.answer_at:                          # "q <person> <item> .": the item right after the person
        assert words[i - 1] == "q" and words[i + 2] == "."
        assert words[i + 1] == owner[words[i]], "the answer is the asked person's item"
    assert len(set(owner.values())) == e.n_items, "items are distinct within an example"


def test_encode_decode_roundtrip_and_errors():
    text = "<bos> eve likes tea . dan likes jam . hal likes figs . gus likes plums . q dan jam . q gus plums . <eos>"
    assert lw.decode(lw.encode(text)) == text
    with pytest.raises(ValueError, match="unknown LikesWorld word"):
        lw.encode("eve loves tea")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        lw.decode([lw.VOCAB_SIZE])
    with pytest.raises(ValueError, match="split must be"):
        lw.make_example(random.Random(0), "valid")


def _world(e: lw.Example) -> list[tuple[str, str]]:
    w = lw.decode(e.tokens).split()
    return [(w[1 + 4 * f], w[3 + 4 * f]) for f in range(e.n_items)]


def test_test_split_is_held_out():
    """No training sequence (evaluation set or training stream) uses a test world, and vice versa."""
    test = lw.examples("test")
    train = lw.examples("train") + [lw.make_example(random.Random(1000), "train") for _ in range(2000)]
    assert all(lw.world_split(_world(e)) == "test" for e in test)
    assert all(lw.world_split(_world(e)) == "train" for e in train)
    test_worlds = {frozenset(_world(e)) for e in test}
    assert not test_worlds & {frozenset(_world(e)) for e in train}
    # every person and item still occurs on both sides: what is held out is the lookup, not the vocabulary
    for side in (test, train):
        seen = {w for e in side for pair in _world(e) for w in pair}
        assert seen == set(lw.PEOPLE) | set(lw.ITEMS)


def test_training_stream_is_deterministic_with_a_curriculum():
    a, b = lw.training_batches(8, seed=0, easy_steps=2), lw.training_batches(8, seed=0, easy_steps=2)
    for step in range(4):
        (xa, ya), (xb, yb) = next(a), next(b)
        assert xa.equal(xb) and ya.equal(yb), "same seed, same batches"
        facts = ((xa == lw.STOI["likes"]).sum(1))
        if step < 2:
            assert (facts == lw.MIN_FACTS).all(), "easy steps: 2 facts per example"
    x, y = next(lw.training_batches(4, seed=0))
    assert x.shape == y.shape and (y[x == lw.PAD_ID] == -100).all(), "padding is ignored by the loss"


def test_random_item_baseline_is_computed_from_the_data():
    exs = lw.examples("test")
    by_hand = [1 / e.n_items for e in exs for _ in e.answer_at]
    base = lw.random_item_baseline("test")
    assert base == pytest.approx(sum(by_hand) / len(by_hand))
    assert 0.2 < base < 0.35, f"2..6 facts: E[1/n] between 1/6 and 1/2 ({base:.3f})"
    print(f"random-item baseline on the test split: {base:.1%}")


def test_prompts_end_right_before_an_answer():
    prompts = lw.make_prompts(60)
    assert len(prompts) == 60 and prompts == lw.make_prompts(60), "deterministic"
    lengths = [len(p) for p in prompts]
    assert min(lengths) >= 2 + 4 * lw.MIN_FACTS and max(lengths) <= 2 + 4 * lw.MAX_FACTS + 4 * (lw.MAX_QUESTIONS - 1)
    assert 15 <= sum(lengths) / 60 <= 23, "varying lengths, about 19 tokens on average (§8.2)"
    for p in prompts:
        assert p[0] == lw.BOS_ID and p[-2] == lw.Q_ID and lw.VOCAB[p[-1]] in lw.PEOPLE
