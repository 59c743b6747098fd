"""`perf/busy/<pool>`: how much of a step each pool's ranks spent in a task, from the
step's timeline. Stateless."""
from __future__ import annotations

__all__ = ["busy_fractions"]


def busy_fractions(timeline: list[dict], ranks_of) -> dict:
    """`perf/busy/<pool>`: the share of the step's span each pool's ranks spent in a
    task (intervals of one rank merged), averaged over the pool's ranks."""
    spans = [e for e in timeline if e.get("pool")]
    if not spans:
        return {}
    start = min(e["start"] for e in timeline)
    wall = max(e["end"] for e in timeline) - start
    if wall <= 0:
        return {}
    by_rank: dict = {}
    for e in spans:
        by_rank.setdefault((e["pool"], e["rank"]), []).append((e["start"], e["end"]))
    busy: dict = {}
    for (pool, _), intervals in by_rank.items():
        busy.setdefault(pool, 0.0)
        busy[pool] += _union_length(intervals)
    return {f"perf/busy/{pool}": total / (wall * max(1, ranks_of(pool)))
            for pool, total in busy.items()}


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total
