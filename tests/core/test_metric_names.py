"""Metric names that are protocol (hybridflow/core/metric_names.py): the engine writes
and reads each through the module's constants, never as a literal of its own."""
from __future__ import annotations

import ast
import glob
import os

from hybridflow.core.metric_names import (OPTIMISED_REWARD_KEYS, SAMPLED_VERSION, SCORE_MEAN,
                                          SHAPED_REWARD_MEAN, STEP_TIME, SUMMED_SUFFIX,
                                          TIMING_PREFIX, TRAINED_VERSION,
                                          TRAINED_VERSION_SUFFIX, is_summed, timing_key)
from hybridflow.runtime.common import sum_round_metrics

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "hybridflow")
PROTOCOL = {SUMMED_SUFFIX, TIMING_PREFIX, TRAINED_VERSION, TRAINED_VERSION_SUFFIX,
            SAMPLED_VERSION, SCORE_MEAN, SHAPED_REWARD_MEAN, STEP_TIME}


def test_the_names_are_the_ones_the_logs_and_docs_use():
    assert timing_key("actor.update") == "timing_s/actor.update"
    assert "actor/" + TRAINED_VERSION == "actor/trained_version"
    assert "actor/trained_version".endswith(TRAINED_VERSION_SUFFIX)
    assert OPTIMISED_REWARD_KEYS == ("critic/rewards/mean", "critic/score/mean")
    assert is_summed("dapo/dropped_groups_total") and not is_summed("dapo/total_groups")


def test_counts_add_up_over_a_gather_s_rounds_and_the_rest_is_averaged():
    rounds = [{"dapo/kept_groups_total": 3.0, "critic/score/mean": 0.2},
              {"dapo/kept_groups_total": 5.0, "critic/score/mean": 0.4}]
    out = sum_round_metrics(rounds)
    assert out["dapo/kept_groups_total"] == 8.0
    assert abs(out["critic/score/mean"] - 0.3) < 1e-12


def _literals(path: str) -> list[tuple[int, str]]:
    """String constants of a file outside docstrings, f-string pieces included."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings]


def test_no_engine_module_spells_a_protocol_name_itself():
    own = os.path.join(PACKAGE, "core", "metric_names.py")
    found = [f"{os.path.relpath(path, PACKAGE)}:{line} {value!r}"
             for path in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True)
             if path != own for line, value in _literals(path) if value in PROTOCOL]
    assert not found, f"use hybridflow.core.metric_names instead: {found}"
