"""Rule scoring of many samples, in this process or in a process pool.

A scorer is named by `ScorerRef` (None path: the table data_source -> scorer that
`reward.scorer_table` names; else a user's Python file and function name) so a
spawned pool process can load it itself (hybridflow/workers/scoring.py). Each
sample, in this process or in the pool, runs under a deadline of `timeout_s`
(hybridflow/core/deadline.py): a sample that runs past it scores 0.0 and is counted, and
the process stays usable; the pool as a whole has a budget too, for a scorer stuck
in native code. A scorer that raises, or returns NaN, is an error naming the row,
its data_source and the scorer.

State: `_LOADED`, the scorer each `ScorerRef` loaded in this process (the pool's
processes fill their own).
"""
from __future__ import annotations

import math
import multiprocessing
from dataclasses import dataclass, field
from typing import Any

from hybridflow.workers.scoring import (DEFAULT_SCORER_TABLE, call_scorer, check_ground_truth,
                                        load_scorer, load_scorer_table, split_score)

__all__ = ["ScorerRef", "ScoringError", "RuleScorer", "SampleResult", "DEFAULT_SCORER_TABLE"]


class ScoringError(RuntimeError):
    """A scorer failed or returned NaN on one row."""


@dataclass(frozen=True)
class ScorerRef:
    """A scorer by name: a user's file and function (`path`, `name`), or, with no path,
    the table data_source -> scorer that `table` names ("package.module:NAME")."""
    path: str | None = None
    name: str = "compute_score"
    # reward.kwargs as (key, value) pairs; not part of the identity (loading is the same)
    kwargs: tuple[tuple[str, Any], ...] = field(default=(), compare=False)
    table: str = DEFAULT_SCORER_TABLE

    def describe(self) -> str:
        if self.path is not None:
            return f"{self.name} from {self.path}"
        if self.table == DEFAULT_SCORER_TABLE:
            return "built-in compute_score"
        return f"scorer by data_source from {self.table}"

    def sample_check(self):
        """`check(data_source, ground_truth)` raising ValueError for values this scorer
        cannot score: a table's needs a data_source it knows and one answer, a
        user's scorer any answer but null."""
        if self.path is None:
            return load_scorer_table(self.table).check_sample
        return lambda data_source, ground_truth: check_ground_truth(ground_truth)

    def load(self):
        if self.path is None:
            return load_scorer_table(self.table)
        return load_scorer(self.path, self.name, dict(self.kwargs))


@dataclass
class SampleResult:
    score: float = 0.0
    extra: dict | None = None
    error: str | None = None
    timed_out: bool = False


_LOADED: dict[ScorerRef, Any] = {}


def score_one(ref: ScorerRef, sample: dict, timeout_s: float | None = None) -> SampleResult:
    """Score one sample within `timeout_s` (see hybridflow/core/deadline.py); never raises
    for the scorer's own errors (returned as text) nor for its timeout (counted).
    An outer deadline (the node's) still propagates."""
    from hybridflow.core.deadline import CallTimeout, call_with_deadline
    what = f"reward scorer {ref.describe()} on one sample"
    try:
        fn = _LOADED.get(ref) or _LOADED.setdefault(ref, ref.load())
        result = call_with_deadline(lambda: call_scorer(fn, sample, dict(ref.kwargs)),
                                    timeout_s, what, "reward.timeout_s")
        score, extra = split_score(result)
    except CallTimeout as err:
        if err.what != what:
            raise  # not this sample's bound: the node's, say
        return SampleResult(timed_out=True)
    except Exception as err:  # noqa: BLE001 - reported with the row by the caller
        return SampleResult(error=f"{type(err).__name__}: {err}")
    return SampleResult(score=score, extra=extra)


def stuck_scorer(ref: ScorerRef, count: int, timeout_s: float) -> ScoringError:
    return ScoringError(
        f"reward scorer {ref.describe()} timed out on {count} samples in a row "
        f"(reward.timeout_s={timeout_s:g}s each): it looks stuck, so the step stops instead "
        f"of waiting rows x {timeout_s:g}s; fix the scorer, raise reward.timeout_s if it is "
        f"only slow, or set reward.max_consecutive_timeouts=0 to score the batch anyway")


class RuleScorer:
    """Scores lists of samples with one scorer, optionally in `num_workers` processes."""

    def __init__(self, ref: ScorerRef, num_workers: int = 0, timeout_s: float = 30.0,
                 max_consecutive_timeouts: int = 3):
        self.ref, self.num_workers, self.timeout_s = ref, num_workers, timeout_s
        self.max_consecutive = max_consecutive_timeouts
        self._pool = None
        ref.load()  # fail at construction on a bad path/name, not mid-run

    def _get_pool(self):
        if self._pool is None:
            self._pool = multiprocessing.get_context("spawn").Pool(self.num_workers)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None

    def __del__(self):
        self.close()

    def _bounded(self, results) -> list[SampleResult]:
        """Consume the results in order; `max_consecutive` timeouts in a row raise
        (the batch's bound: a stuck scorer is heard of after that many timeouts)."""
        out, run = [], 0
        for result in results:
            out.append(result)
            run = run + 1 if result.timed_out else 0
            if self.max_consecutive and run >= self.max_consecutive:
                raise stuck_scorer(self.ref, run, self.timeout_s)
        return out

    def score(self, samples: list[dict]) -> list[SampleResult]:
        if self.num_workers > 0 and samples:
            pool = self._get_pool()
            pending = [pool.apply_async(score_one, (self.ref, s, self.timeout_s))
                       for s in samples]
            budget = self.timeout_s * (len(samples) / self.num_workers + 1) + 30
            try:
                results = self._bounded(p.get(timeout=budget) for p in pending)
            except multiprocessing.TimeoutError:
                self.close()  # a scorer stuck outside Python: start a fresh pool next time
                raise ScoringError(f"reward scoring with {self.ref.describe()} did not finish "
                                   f"within {budget:.0f}s; a scorer may be stuck in native code"
                                   ) from None
            except ScoringError:
                self.close()  # its processes are busy with the stuck scorer
                raise
        else:
            results = self._bounded(score_one(self.ref, s, self.timeout_s) for s in samples)
        for row, (sample, result) in enumerate(zip(samples, results)):
            where = (f"row {row} (data_source={sample['data_source']!r}, scorer "
                     f"{self.ref.describe()})")
            if result.error is not None:
                raise ScoringError(f"reward scorer failed on {where}: {result.error}")
            if not result.timed_out and not math.isfinite(result.score):
                raise ScoringError(f"reward scorer returned {result.score} on {where}")
        return results
