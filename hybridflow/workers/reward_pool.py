"""Rule scoring of many samples, in this process or in a process pool.

A scorer is named by `ScorerRef` (None path: the built-in `compute_score` that
dispatches on data_source; else a user's Python file and function name) so a spawned
pool process can load it itself. In the pool each sample runs under a SIGALRM
timer: a sample that runs past `timeout_s` scores 0.0 and is counted, and the
process stays usable. A scorer that raises, or returns NaN, is an error naming the
row, its data_source and the scorer.
"""
from __future__ import annotations

import math
import multiprocessing
import signal
from dataclasses import dataclass
from typing import Any

__all__ = ["ScorerRef", "ScoringError", "RuleScorer", "SampleResult"]


class ScoringError(RuntimeError):
    """A scorer failed or returned NaN on one row."""


@dataclass(frozen=True)
class ScorerRef:
    path: str | None = None
    name: str = "compute_score"

    def describe(self) -> str:
        return "built-in compute_score" if self.path is None else f"{self.name} from {self.path}"

    def load(self):
        if self.path is None:
            from algorithms.rewards import compute_score
            return compute_score
        from algorithms.rewards import load_scorer
        return load_scorer(self.path, self.name)


@dataclass
class SampleResult:
    score: float = 0.0
    extra: dict | None = None
    error: str | None = None
    timed_out: bool = False


_LOADED: dict[ScorerRef, Any] = {}


def _timeout_handler(signum, frame):
    raise TimeoutError


def score_one(ref: ScorerRef, kwargs: dict, timeout_s: float | None = None) -> SampleResult:
    """Score one sample; never raises (errors are returned as text)."""
    from algorithms.rewards import split_score
    try:
        fn = _LOADED.get(ref) or _LOADED.setdefault(ref, ref.load())
        if timeout_s:
            signal.signal(signal.SIGALRM, _timeout_handler)
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            score, extra = split_score(fn(**kwargs))
        finally:
            if timeout_s:
                signal.setitimer(signal.ITIMER_REAL, 0)
    except TimeoutError:
        return SampleResult(timed_out=True)
    except Exception as err:  # noqa: BLE001 - reported with the row by the caller
        return SampleResult(error=f"{type(err).__name__}: {err}")
    return SampleResult(score=score, extra=extra)


class RuleScorer:
    """Scores lists of samples with one scorer, optionally in `num_workers` processes."""

    def __init__(self, ref: ScorerRef, num_workers: int = 0, timeout_s: float = 30.0):
        self.ref, self.num_workers, self.timeout_s = ref, num_workers, timeout_s
        ref.load()  # fail at construction on a bad path/name, not mid-run
        self._pool = None

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

    def score(self, samples: list[dict]) -> list[SampleResult]:
        if self.num_workers > 0 and samples:
            pool = self._get_pool()
            pending = [pool.apply_async(score_one, (self.ref, s, self.timeout_s))
                       for s in samples]
            budget = self.timeout_s * (len(samples) / self.num_workers + 1) + 30
            try:
                results = [p.get(timeout=budget) for p in pending]
            except multiprocessing.TimeoutError:
                self.close()  # a scorer stuck outside Python: start a fresh pool next time
                raise ScoringError(f"reward scoring with {self.ref.describe()} did not finish "
                                   f"within {budget:.0f}s; a scorer may be stuck in native code")
        else:
            results = [score_one(self.ref, s) for s in samples]
        for row, (sample, result) in enumerate(zip(samples, results)):
            where = (f"row {row} (data_source={sample['data_source']!r}, scorer "
                     f"{self.ref.describe()})")
            if result.error is not None:
                raise ScoringError(f"reward scorer failed on {where}: {result.error}")
            if not result.timed_out and not math.isfinite(result.score):
                raise ScoringError(f"reward scorer returned {result.score} on {where}")
        return results
