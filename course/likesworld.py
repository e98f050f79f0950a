"""LikesWorld: the tiny data set of the lecture's demos (§2.2).

One example is one token sequence:

    <bos> eve likes tea . dan likes jam . hal likes figs . gus likes plums . q dan jam . q gus plums . <eos>
          └──────────────────── facts ─────────────────────┘ └──────── questions ───────┘

The token after "q <person>" is the item that person likes; to predict it the model must find
"<person> likes ___" in the context and copy the item (a two-step lookup, §2.2). The person
sits directly before the answer: the notes report that their first format, "q dan ? a jam",
with two tokens in between, stalled a small model at the random-item level.

Held-out test split: whole WORLDS are held out. A world is the set of facts of an example
(who likes what); it belongs to the test split when the CRC-32 of its sorted facts is divisible
by 5 (one world in five). Training examples are drawn only from the other worlds, so no test
example's facts ever occur together in training; pairs, people and items all occur in both splits
(what is held out is the lookup, not the vocabulary).
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

# §2.2 vocabulary -------------------------------------------------------------------------------
PAD, BOS, EOS, LIKES, DOT, Q = "<pad>", "<bos>", "<eos>", "likes", ".", "q"
PEOPLE = ("amy", "bob", "cat", "dan", "eve", "fay", "gus", "hal", "ian", "joy", "kim", "lee")
ITEMS = ("tea", "jam", "figs", "plums", "rice", "soup", "nuts", "pie", "cake", "eggs", "milk", "corn")
VOCAB: tuple[str, ...] = (PAD, BOS, EOS, LIKES, DOT, Q, *PEOPLE, *ITEMS)
VOCAB_SIZE = len(VOCAB)
STOI = {w: i for i, w in enumerate(VOCAB)}
PAD_ID, BOS_ID, EOS_ID, Q_ID = STOI[PAD], STOI[BOS], STOI[EOS], STOI[Q]
ITEM_IDS = frozenset(STOI[w] for w in ITEMS)

MIN_FACTS, MAX_FACTS = 2, 6        # facts per example
MAX_QUESTIONS = 3                  # questions per example (distinct people)
MAX_SEQ_LEN = 1 + 4 * MAX_FACTS + 4 * MAX_QUESTIONS + 1   # 38 tokens

TEST_WORLD_MODULUS = 5                   # a world is in the test split iff crc32 % 5 == 0
SPLIT_SEEDS = {"train": 0, "test": 1}   # default seeds of the fixed evaluation sets
EVAL_SIZE = 1000                         # examples per fixed evaluation set


def encode(text: str | Sequence[str]) -> list[int]:
    """Words (a space-separated string or a list of words) -> token ids."""
    words = text.split() if isinstance(text, str) else list(text)
    unknown = [w for w in words if w not in STOI]
    if unknown:
        raise ValueError(f"unknown LikesWorld word(s) {unknown}; the vocabulary is {list(VOCAB)}")
    return [STOI[w] for w in words]


def decode(ids: Sequence[int] | torch.Tensor) -> str:
    """Token ids -> space-separated words."""
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    bad = [i for i in ids if not 0 <= int(i) < VOCAB_SIZE]
    if bad:
        raise ValueError(f"token id(s) {bad} outside the vocabulary 0..{VOCAB_SIZE - 1}")
    return " ".join(VOCAB[int(i)] for i in ids)


@dataclass(frozen=True)
class Example:
    """One sequence. answer_at[k] is the index of the asked person in question k; the target
    is tokens[answer_at[k] + 1], the item that person likes."""
    tokens: tuple[int, ...]
    answer_at: tuple[int, ...]
    n_items: int                      # distinct items in the context (= number of facts)


def world_split(facts: Sequence[tuple[str, str]]) -> str:
    """"test" or "train": which split the world (the set of facts, order ignored) belongs to."""
    key = " ".join(f"{p}:{it}" for p, it in sorted(facts)).encode()
    return "test" if zlib.crc32(key) % TEST_WORLD_MODULUS == 0 else "train"


def _sample_facts(rng: random.Random, split: str, max_facts: int) -> list[tuple[str, str]]:
    """Distinct people with distinct items, from a world of the requested split."""
    n = rng.randint(MIN_FACTS, max_facts)
    while True:
        facts = list(zip(rng.sample(PEOPLE, n), rng.sample(ITEMS, n)))
        if world_split(facts) == split:
            return facts


def make_example(rng: random.Random, split: str, max_facts: int = MAX_FACTS) -> Example:
    """One example of `split` ("train" or "test") drawn with `rng` in the §2.2 format, with
    MIN_FACTS..max_facts facts and 1..3 questions."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not MIN_FACTS <= max_facts <= MAX_FACTS:
        raise ValueError(f"max_facts must be in {MIN_FACTS}..{MAX_FACTS}, got {max_facts}")
    facts = _sample_facts(rng, split, max_facts)
    asked = rng.sample(facts, rng.randint(1, min(MAX_QUESTIONS, len(facts))))
    words, answer_at = [BOS], []
    for person, item in facts:
        words += [person, LIKES, item, DOT]
    for person, item in asked:
        answer_at.append(len(words) + 1)          # index of the person after "q"
        words += [Q, person, item, DOT]
    words.append(EOS)
    return Example(tuple(encode(words)), tuple(answer_at), len(facts))


def examples(split: str, n: int = EVAL_SIZE, seed: int | None = None) -> list[Example]:
    """A fixed list of n examples (same split and seed -> same list)."""
    return list(itertools.islice(iter_examples(split, seed), n))


def iter_examples(split: str, seed: int | None = None) -> Iterator[Example]:
    """The examples of examples(split, n, seed) one at a time, without end: its first n are that list
    (one draw continues the same generator), for a caller that needs only the first few."""
    rng = random.Random(SPLIT_SEEDS[split] if seed is None else seed)

    def draw() -> Iterator[Example]:
        while True:
            yield make_example(rng, split)
    return draw()


def collate(batch: Sequence[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest example. Returns inputs (B, T) and next-token targets (B, T)
    with PAD targets set to -100 (ignored by cross_entropy); causal attention means the padding
    after a sequence never influences it."""
    T = max(len(e.tokens) for e in batch)
    seq = torch.full((len(batch), T), PAD_ID, dtype=torch.long)
    for b, e in enumerate(batch):
        seq[b, : len(e.tokens)] = torch.tensor(e.tokens)
    inputs, targets = seq[:, :-1], seq[:, 1:].clone()
    targets[targets == PAD_ID] = -100
    return inputs, targets


def training_batches(batch_size: int, seed: int = 0, easy_steps: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """An endless, deterministic stream of training batches (fixed data order for a seed).
    Curriculum: the first `easy_steps` batches have only MIN_FACTS (2) facts per example."""
    rng = random.Random(1000 + seed)     # never equal to the evaluation seeds
    step = 0
    while True:
        max_facts = MIN_FACTS if step < easy_steps else MAX_FACTS
        yield collate([make_example(rng, "train", max_facts) for _ in range(batch_size)])
        step += 1


def answer_mask(inputs: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: positions whose next token is an answer (the person right after "q")."""
    return F.pad(inputs[:, :-1] == Q_ID, (1, 0))


def _as_examples(split: str | Sequence[Example]) -> list[Example]:
    return examples(split) if isinstance(split, str) else list(split)


@torch.no_grad()
def evaluate(model: torch.nn.Module, split: str | Sequence[Example] = "test",
             attention: Callable | None = None, batch_size: int = 250) -> float:
    """Accuracy of the greedy prediction (argmax over the whole vocabulary) of the item after
    each "q <person>". `split` is "train"/"test" (the fixed 1,000-example sets) or a list of
    Examples; `attention` is passed to model(tokens, attention=...) when given."""
    exs = _as_examples(split)
    kwargs = {} if attention is None else {"attention": attention}
    correct = total = 0
    for s in range(0, len(exs), batch_size):
        batch = exs[s: s + batch_size]
        inputs, _ = collate(batch)
        pred = model(inputs, **kwargs).argmax(-1)                 # (B, T)
        for b, e in enumerate(batch):
            for i in e.answer_at:
                correct += int(pred[b, i] == e.tokens[i + 1])
                total += 1
    return correct / total


def random_item_baseline(split: str | Sequence[Example] = "test") -> float:
    """Expected accuracy of answering each question with an item drawn uniformly from the
    distinct items that appear in its context: the mean of 1 / (items in context)."""
    exs = _as_examples(split)
    chances = [1.0 / e.n_items for e in exs for _ in e.answer_at]
    return sum(chances) / len(chances)


def make_prompts(n: int = 60, seed: int = 2) -> list[list[int]]:
    """n generation prompts from the test split: "<bos> facts... q <person>", cut right before
    the answer of the example's first question (lengths 11..27 tokens). The next greedy token
    should be that person's item; the model then continues with ". q ... <eos>"."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        e = make_example(rng, "test")
        prompts.append(list(e.tokens[: e.answer_at[0] + 1]))
    return prompts
