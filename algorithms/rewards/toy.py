"""The toy arithmetic task, the embedded default: prompts "7+5=", answers "12".

Two operands in 0..max_operand, operator `+`. Rows follow verl's dataset
schema. The scorer reads decoded strings only, so it works with any
tokenizer (a character tokenizer in tests, a real one elsewhere).
"""
from __future__ import annotations

import random

DATA_SOURCE = "toy_arith"
# Text a decoder may leave at the end of a response; everything from the
# first of them (or the first newline) on is not part of the answer.
EOS_MARKERS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "</s>", "<eos>")

Pair = tuple[int, int]
# The problem space is (max_operand + 1)^2 pairs, built whole: it is bounded so that
# making it takes seconds; rows repeat pairs in whole passes, up to MAX_PASSES of them.
MAX_PAIRS = 1_000_000
MAX_OPERAND = 999  # the largest max_operand whose pairs fit MAX_PAIRS
MAX_PASSES = 10


def all_pairs(max_operand: int = 9) -> list[Pair]:
    """Every distinct (a, b) with 0 <= a, b <= max_operand, in order."""
    if max_operand < 0:
        raise ValueError(f"max_operand must be >= 0, got {max_operand}")
    if max_operand > MAX_OPERAND:
        raise ValueError(f"max_operand={max_operand:,} asks for {(max_operand + 1) ** 2:,} "
                         f"problems; at most max_operand={MAX_OPERAND} "
                         f"({MAX_PAIRS:,} problems) is made")
    return [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]


def make_problem(a: int, b: int, index: int) -> dict:
    """One row: {"data_source", "prompt", "ability", "reward_model", "extra_info"}."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": f"{a}+{b}=",
        "ability": "math",
        "reward_model": {"ground_truth": str(a + b)},
        "extra_info": {"index": index},
    }


def _sample_rows(pairs: list[Pair], n: int, rng: random.Random) -> list[dict]:
    """n rows drawn from `pairs`: whole shuffled passes, so n <= len(pairs) gives distinct
    problems."""
    if n < 0:
        raise ValueError(f"number of problems must be >= 0, got {n}")
    if n > MAX_PASSES * len(pairs):
        raise ValueError(f"{n:,} rows from {len(pairs):,} distinct problems would repeat each "
                         f"{n // max(1, len(pairs)):,} times; at most {MAX_PASSES * len(pairs):,} "
                         f"rows ({MAX_PASSES} passes) are made: ask for fewer rows or more "
                         f"problems (a larger max_operand)")
    rows: list[dict] = []
    while len(rows) < n:
        order = list(pairs)
        rng.shuffle(order)
        for a, b in order[: n - len(rows)]:
            rows.append(make_problem(a, b, len(rows)))
    return rows


def make_problems(n: int, seed: int, max_operand: int = 9) -> list[dict]:
    """n problems from all (a, b) pairs, deterministic in `seed`; extra_info.index = 0..n-1."""
    return _sample_rows(all_pairs(max_operand), n, random.Random(seed))


def split_pairs(seed: int = 0, max_operand: int = 9,
                test_fraction: float = 0.2) -> tuple[list[Pair], list[Pair]]:
    """Partition the distinct pairs into (train_pairs, test_pairs), deterministic in `seed`.

    The test share is round(test_fraction * pairs), at least 1, and the train
    share is never empty.
    """
    pairs = all_pairs(max_operand)
    if len(pairs) < 2:
        raise ValueError(f"max_operand={max_operand} gives {len(pairs)} distinct problem(s): "
                         "nothing to hold out")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    random.Random(f"split-{seed}").shuffle(pairs)
    n_test = min(max(1, round(test_fraction * len(pairs))), len(pairs) - 1)
    return pairs[n_test:], pairs[:n_test]


def train_test_split(n_train: int, n_test: int, seed: int = 0, max_operand: int = 9,
                     test_fraction: float = 0.2) -> tuple[list[dict], list[dict]]:
    """(train rows, test rows) drawn from disjoint sets of (a, b) pairs.

    A held-out problem never appears in train, so test accuracy measures
    generalisation, not memorisation. Deterministic in `seed`.
    """
    train_pairs, test_pairs = split_pairs(seed, max_operand, test_fraction)
    train = _sample_rows(train_pairs, n_train, random.Random(f"train-{seed}"))
    test = _sample_rows(test_pairs, n_test, random.Random(f"test-{seed}"))
    return train, test


def train_test_rows(seed: int, max_operand: int, test_fraction: float,
                    train_on_test: bool = False) -> tuple[list[dict], list[dict]]:
    """Every train pair once and every held-out pair once, deterministic in `seed`:
    the embedded default's data (`data.toy.maker`). `train_on_test` adds the held-out
    rows to train (for making a base model only)."""
    train_pairs, test_pairs = split_pairs(seed, max_operand, test_fraction)
    train, test = train_test_split(len(train_pairs), len(test_pairs), seed, max_operand,
                                   test_fraction)
    return (train + test if train_on_test else train), test


def extract_answer(solution_str: str) -> str:
    """The response up to the first end-of-text marker or newline, whitespace stripped."""
    cut = len(solution_str)
    for marker in EOS_MARKERS + ("\n",):
        found = solution_str.find(marker)
        if found != -1:
            cut = min(cut, found)
    return solution_str[:cut].strip()


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict | None = None) -> float:
    """1.0 if the extracted answer equals the ground truth exactly, else 0.0."""
    return 1.0 if extract_answer(solution_str) == str(ground_truth).strip() else 0.0
