"""Short arithmetic word problems in GSM8K's answer format: a task a 135M chat model
can learn on a CPU (`hybridflow data word_arith`).

"Mia has 23 stickers. She gets 14 more. How many stickers does Mia have now?" — one
operation (+, -, x) on small numbers, as chat-message prompts that ask for the final
answer after "####". A row's `extra_info.answer` is the worked solution in GSM8K's
form ("23 + 14 = 37\\n#### 37"); `reward_model.ground_truth` is the number. Rows are
scored by the GSM8K scorer (algorithms/rewards/gsm8k.py: strict or flexible
extraction, a format score), registered for DATA_SOURCE.

Train and test are drawn from disjoint sets of (template, operands): a held-out
problem never appears in train with the same numbers, so test accuracy measures
arithmetic and format, not recall. Deterministic in `seed`.
"""
from __future__ import annotations

import random

DATA_SOURCE = "word_arith"
INSTRUCTION = 'Give the final answer after "####".'

NAMES = ("Tom", "Mia", "Ben", "Sara", "Leo", "Emma", "Sam", "Lily", "Max", "Anna")
ITEMS = ("apples", "stickers", "pencils", "marbles", "cookies", "books", "cards", "shells")

# (operation, text with {name} {item} {a} {b}); "sub" keeps a >= b, "mul" small factors
TEMPLATES = (
    ("add", "{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} "
            "have now?"),
    ("add", "There are {a} {item} in a box and {b} {item} on the table. How many {item} "
            "are there in all?"),
    ("sub", "{name} had {a} {item} and gave away {b}. How many {item} does {name} have "
            "left?"),
    ("sub", "A shop had {a} {item} and sold {b} of them. How many {item} are left?"),
    ("mul", "{name} has {a} bags with {b} {item} in each bag. How many {item} does {name} "
            "have?"),
)
_SYMBOL = {"add": "+", "sub": "-", "mul": "*"}
# The problem space grows as max_number^2 and is built whole, so it is bounded; train
# rows repeat problems in whole shuffled passes, up to MAX_PASSES of them (more add
# nothing but time: 100,000,000 rows of 1,144 problems is minutes of silence).
MAX_PROBLEMS = 1_000_000
MAX_PASSES = 10


def _operands(op: str, max_number: int) -> list[tuple[int, int]]:
    if op == "mul":
        top = min(9, max_number)
        return [(a, b) for a in range(2, top + 1) for b in range(2, top + 1)]
    pairs = [(a, b) for a in range(1, max_number + 1) for b in range(1, max_number + 1)]
    return [(a, b) for a, b in pairs if a > b] if op == "sub" else pairs


def problem_count(max_number: int) -> int:
    """How many (template, a, b) the task can ask, without making them."""
    top = min(9, max_number)
    per_op = {"add": max_number ** 2, "sub": max_number * (max_number - 1) // 2,
              "mul": max(0, top - 1) ** 2}
    return sum(per_op[op] for op, _ in TEMPLATES)


def largest_max_number() -> int:
    """The largest max_number whose problems fit MAX_PROBLEMS."""
    low, high = 3, 10 ** 6
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if problem_count(mid) <= MAX_PROBLEMS else (low, mid - 1)
    return low


def check_size(n_train: int, n_test: int, max_number: int) -> int:
    """Refuse, before any work, what the problem space cannot give; the problem count."""
    if max_number < 3:
        raise ValueError(f"max_number must be at least 3, got {max_number}")
    if problem_count(max_number) > MAX_PROBLEMS:
        raise ValueError(f"max_number={max_number:,} gives {problem_count(max_number):,} "
                         f"problems; at most max_number={largest_max_number()} "
                         f"({MAX_PROBLEMS:,} problems) is made")
    total = problem_count(max_number)
    if n_train < 1 or n_test < 1:
        raise ValueError(f"n_train and n_test must be at least 1, got {n_train}, {n_test}")
    if n_test >= total:
        raise ValueError(f"n_test={n_test:,} leaves no training problem: max_number="
                         f"{max_number} gives {total:,} problems; at most n_test={total - 1:,} "
                         f"(raise max_number)")
    most = MAX_PASSES * (total - n_test)
    if n_train > most:
        raise ValueError(f"n_train={n_train:,} is more than the task can make: max_number="
                         f"{max_number} gives {total - n_test:,} training problems, and rows "
                         f"repeat them at most {MAX_PASSES} times, so at most n_train={most:,}; "
                         f"lower n_train or raise max_number (up to {largest_max_number()})")
    return total


def all_problems(max_number: int = 20) -> list[tuple[int, int, int]]:
    """Every (template index, a, b) the task can ask, in order."""
    check_size(1, 1, max_number)
    return [(t, a, b) for t, (op, _) in enumerate(TEMPLATES)
            for a, b in _operands(op, max_number)]


def answer_of(op: str, a: int, b: int) -> int:
    return a + b if op == "add" else a - b if op == "sub" else a * b


def make_row(template: int, a: int, b: int, index: int, rng: random.Random,
             split: str) -> dict:
    """One row in verl's schema, with a chat-message prompt."""
    op, text = TEMPLATES[template]
    question = text.format(name=rng.choice(NAMES), item=rng.choice(ITEMS), a=a, b=b)
    result = answer_of(op, a, b)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(result)},
        "extra_info": {"index": index, "split": split, "op": op, "problem": [template, a, b],
                       "question": question,
                       "answer": f"{a} {_SYMBOL[op]} {b} = {result}\n#### {result}"},
    }


def train_test_rows(seed: int = 1, n_train: int = 2000, n_test: int = 100,
                    max_number: int = 20, progress=None) -> tuple[list[dict], list[dict]]:
    """(train rows, test rows) from disjoint problems, deterministic in `seed`; each
    operation is held out in proportion to how many problems it has. What cannot be
    made is refused before any row is (`check_size`); `progress(rows)` is called
    every 10,000 rows made, for a progress bar."""
    check_size(n_train, n_test, max_number)
    problems = all_problems(max_number)
    random.Random(f"word-arith-split-{seed}").shuffle(problems)
    test_problems, train_problems = problems[:n_test], problems[n_test:]
    rng = random.Random(f"word-arith-rows-{seed}")
    test = [make_row(*p, i, rng, "test") for i, p in enumerate(test_problems)]
    train = []
    while len(train) < n_train:  # whole shuffled passes: distinct until they run out
        order = list(train_problems)
        rng.shuffle(order)
        for p in order[: n_train - len(train)]:
            train.append(make_row(*p, len(train), rng, "train"))
            if progress is not None and len(train) % 10_000 == 0:
                progress(10_000)
    return train, test
