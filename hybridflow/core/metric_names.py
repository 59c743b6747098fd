"""Metric names that are protocol: one part of the engine writes them and another reads
them back by name, so a rename on one side must be a rename on the other. Each is
written and read through the constants here; a metric only logged is named where it is
logged.

- `SUMMED_SUFFIX`: a metric whose key ends in `_total` is a count, added up wherever
  metrics of several parts are merged: data-parallel ranks and shards
  (`graph/dispatch.py` `merge_metrics`), a gather's rounds (`runtime/common.py`
  `sum_round_metrics`), validation batches (`run/loop.py`); every other metric is
  averaged (weighted by rows). Graph functions name their counts so (`graphs/ops.py`).
- `TIMING_PREFIX`: `timing_s/<node>`, a node's span in a step (first task start to last
  task end), written by the scheduler; the run scheduler adds up a step's passes.
- `RUNTIME_PREFIX`: `runtime/...`, the scheduler's own timings of a step.
- `TRAINED_VERSION`: `<role>/trained_version`, the update count of a trained role's
  weights before the step's update (the actor writes it); with the trained rows'
  `policy_version` column the run scheduler computes how stale they were
  (`async/staleness/*`). `SAMPLED_VERSION`, `rollout/sampled_version`, is the
  version a generate node sampled with (its metric).
- `SCORE_MEAN` (`critic/score/mean`, the reward worker's mean score) and
  `SHAPED_REWARD_MEAN` (`critic/rewards/mean`, the reward after a graph's shaping):
  the progress bar of `hybridflow run` shows the first of `OPTIMISED_REWARD_KEYS`.
- `MFU` (`perf/mfu`): a model phase's achieved FLOP rate over the device's measured
  peak, written by the worker (workers/mfu.py); the scheduler logs it per node as
  `perf/mfu/<node>` (`mfu_key`), verl's name.
- `STEP_TIME` (`perf/time_per_step`): the loop's wall time of a step, which reading a
  measured run for the planner takes the median of (`program/run_dir.py`).
- `ZERO_STD_GROUPS` (`critic/score/frac_zero_std`, TRL's `frac_reward_zero_std`): the
  share of a step's groups whose responses all got the same score, so their
  group-relative advantages are 0 (graphs/ops.py writes it); `hybridflow run` warns
  once when it stays near 1 (commands/run_watch.py).
"""
from __future__ import annotations

__all__ = ["SUMMED_SUFFIX", "TIMING_PREFIX", "RUNTIME_PREFIX", "TRAINED_VERSION",
           "TRAINED_VERSION_SUFFIX", "SAMPLED_VERSION", "SCORE_MEAN", "SHAPED_REWARD_MEAN",
           "OPTIMISED_REWARD_KEYS", "STEP_TIME", "ZERO_STD_GROUPS", "MFU", "timing_key",
           "mfu_key", "node_scoped", "is_summed"]

SUMMED_SUFFIX = "_total"
TIMING_PREFIX = "timing_s/"
RUNTIME_PREFIX = "runtime/"
TRAINED_VERSION = "trained_version"  # under the role's prefix: actor/trained_version
TRAINED_VERSION_SUFFIX = "/" + TRAINED_VERSION
SAMPLED_VERSION = "rollout/sampled_version"
SCORE_MEAN = "critic/score/mean"
SHAPED_REWARD_MEAN = "critic/rewards/mean"
# The reward the update optimises: after the graph's shaping (a KL penalty in the
# reward, an overlong penalty) or, when nothing shapes it, the reward worker's score.
OPTIMISED_REWARD_KEYS = (SHAPED_REWARD_MEAN, SCORE_MEAN)
STEP_TIME = "perf/time_per_step"
MFU = "perf/mfu"
ZERO_STD_GROUPS = "critic/score/frac_zero_std"


def timing_key(node: str) -> str:
    """`timing_s/<node>`."""
    return TIMING_PREFIX + node


def mfu_key(node: str) -> str:
    """`perf/mfu/<node>`."""
    return f"{MFU}/{node}"


def node_scoped(node: str, metrics: dict) -> dict:
    """A node's metrics with the per-node ones (`MFU`) named after the node, so two
    model nodes' rates do not overwrite each other when a step's metrics merge."""
    if MFU not in metrics:
        return metrics
    out = {k: v for k, v in metrics.items() if k != MFU}
    out[mfu_key(node)] = metrics[MFU]
    return out


def is_summed(key: str) -> bool:
    """A count, added up over ranks, rounds and batches rather than averaged."""
    return key.endswith(SUMMED_SUFFIX)
