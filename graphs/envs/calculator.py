"""The toy agent task: sums of numbers too long for the tiny model to add alone, with
a `calc` tool that adds them. Declare it as `graphs/envs/calculator.py:make_env`.

An episode, in the toy tokenizer's plain format (no angle brackets in its vocabulary,
so the call is written `calc(...)`):

    48213+90872=calc(48213+90872)<eos>        prompt, then the model's tool call
    calc: 139085                              the observation (tool result) ...
    answer: 139085<eos>                       ... and the model's final answer

A turn without a call is the final answer: reward 1 if it equals the sum exactly
(read like the toy arithmetic task: up to the first newline or end marker), else 0.
A call that does not parse or adds something that is not a sum of whole numbers is
a tool error (reward 0, `agent/tool_errors_total`). The model may also answer without
the tool; for five-digit operands the tiny model rarely gets that right.

Rows follow verl's dataset schema (`make_problems`, `train_test_split`; the loader
turns them into `raw_prompt`/`ground_truth` columns, which the environment reads).
`demonstration` writes an episode's text for supervised fine-tuning of a base model
that calls the tool (the SFT data for the agent task's base checkpoint).

Stateless module; an environment keeps its episode's row.
"""
from __future__ import annotations

import random
import re

from hybridflow.algorithms.rewards.toy import extract_answer
from hybridflow.agents import Tool, ToolEnvironment

DATA_SOURCE = "toy_calc"
TOOL = "calc"
RESULT_TEMPLATE = "\ncalc: {result}\nanswer: "
_SUM = re.compile(r"\d+(\+\d+)+")


def add_numbers(expression: str) -> str:
    """'48213+90872' -> '139085'; anything but a sum of whole numbers is an error."""
    text = expression.replace(" ", "")
    if not _SUM.fullmatch(text):
        raise ValueError(f"calc adds whole numbers written like 12+30, got {expression!r}")
    return str(sum(int(part) for part in text.split("+")))


def score_answer(answer: str, row: dict) -> float:
    return 1.0 if extract_answer(answer) == str(row["ground_truth"]).strip() else 0.0


def make_env() -> ToolEnvironment:
    """A fresh environment for one episode (the runner calls this per episode)."""
    return ToolEnvironment(Tool(TOOL, add_numbers, call_format="function"), score_answer,
                           prompt_key="raw_prompt", result_template=RESULT_TEMPLATE)


def make_problem(operands: list[int], index: int) -> dict:
    return {"data_source": DATA_SOURCE, "prompt": "+".join(map(str, operands)) + "=",
            "ability": "math", "reward_model": {"ground_truth": str(sum(operands))},
            "extra_info": {"index": index}}


def _draw(rng: random.Random, digits: int, operands: int) -> tuple[int, ...]:
    low = 10 ** (digits - 1) if digits > 1 else 0
    return tuple(rng.randint(low, 10 ** digits - 1) for _ in range(operands))


def train_test_split(n_train: int, n_test: int, seed: int = 0, digits: int = 5,
                     operands: int = 2) -> tuple[list[dict], list[dict]]:
    """(train rows, test rows) with no problem in both; deterministic in `seed`."""
    if digits < 1 or operands < 2:
        raise ValueError(f"need digits >= 1 and operands >= 2, got {digits}, {operands}")
    rng, seen = random.Random(f"calc-{seed}"), set()
    problems = []
    while len(problems) < n_train + n_test:
        drawn = _draw(rng, digits, operands)
        if drawn not in seen:
            seen.add(drawn)
            problems.append(drawn)
    rows = [make_problem(list(p), i) for i, p in enumerate(problems)]
    return rows[:n_train], rows[n_train:]


def as_episode_row(row: dict) -> dict:
    """A dataset row as the loader hands it to the environment (raw_prompt, ground_truth)."""
    return {"raw_prompt": row["prompt"], "ground_truth": row["reward_model"]["ground_truth"],
            "data_source": row["data_source"], "extra_info": row.get("extra_info") or {}}


def demonstration(row: dict, rng: random.Random, call_probability: float = 0.7,
                  malformed_probability: float = 0.1) -> list[tuple[str, bool]]:
    """One SFT example as (text, trained) pieces after the prompt, `None`-free; an EOS
    follows each trained piece. With `call_probability` the model calls the tool and
    copies its result; otherwise it answers alone (a guess off by a small amount half
    of the time, as an untrained adder would); some calls are malformed."""
    expression = row["prompt"].rstrip("=")
    answer = str(row["reward_model"]["ground_truth"])
    if rng.random() < call_probability:
        call = f"{TOOL}({expression})"
        if rng.random() < malformed_probability:
            return [(call[:-1], True)]  # the closing parenthesis forgotten
        return [(call, True), (RESULT_TEMPLATE.format(result=answer), False), (answer, True)]
    guess = answer if rng.random() < 0.5 else str(int(answer) + rng.choice((-10, -1, 1, 10)))
    return [(guess, True)]
