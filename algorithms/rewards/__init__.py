"""Rule-based reward functions of the shipped tasks, by data_source.

A scorer is `compute_score(data_source, solution_str, ground_truth,
extra_info=None) -> float | dict`, called by keyword (the contract, and the
machinery that loads, calls and checks scorers, is the engine's:
`hybridflow/workers/scoring.py`). Scorers read decoded strings only.

`SCORERS` maps each data_source to its scorer; the reward worker finds it by name
(`reward.scorer_table`, default "hybridflow.algorithms.rewards:SCORERS"). `compute_score`
dispatches on data_source, for scripts and benches that score outside the engine.
"""
from __future__ import annotations

from typing import Callable

from hybridflow.algorithms.registry import lookup
from hybridflow.algorithms.rewards import gsm8k, toy, word_arith

SCORERS: dict[str, Callable[..., "float | dict"]] = {toy.DATA_SOURCE: toy.compute_score}
SCORERS.update({source: gsm8k.compute_score for source in gsm8k.DATA_SOURCES})
SCORERS[word_arith.DATA_SOURCE] = gsm8k.compute_score  # GSM8K's answer format


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict | None = None, **kwargs) -> float | dict:
    """Score with the scorer registered for `data_source`; `kwargs` go to it."""
    scorer = lookup(SCORERS, data_source, "data_source (no built-in scorer)")
    return scorer(data_source=data_source, solution_str=solution_str,
                  ground_truth=ground_truth, extra_info=extra_info, **kwargs)
