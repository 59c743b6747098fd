"""The stream side's records in a streaming run's timeline (`trainer.async_mode=streaming`).

The train side's tasks are recorded by the pass that runs them; the generation is not a
task of a pass: the run scheduler's stream source (stream_source.py) drives it through
`stream_poll`.
What the scheduler sees of it, per rank of the rollout role, becomes timeline records
of the generate node, `{"node", "role", "pool", "rank", "start", "end", "stream",
"decode_steps", "rows"}`:

- `stream: "decode"` (inline polls: the local runtime, or a rollout sharing the actor's
  process): the poll call itself, which ran the decode steps;
- `stream: "poll"` (the engine loop on the rollout worker's own thread): what the loop
  spent decoding between two polls — the reply's `spans`, the wall-clock intervals of
  its decode steps (merged on the worker when they touch), so the pool's busy time
  counts the engine's work, not its waits for room in the buffer — with the decode
  steps it counted and the rows that finished on the last of them (steps decoded
  between two steps, which are not recorded, go on a record of no length at the
  step's start, so every decode step counted is on record). A reply without
  spans (an engine that does not time its steps) is recorded as the interval between
  the two polls when the engine had requests in flight or made progress. Touching
  records are merged, so a wait of many short polls is one record per rank.

A step's records start no earlier than the step (the time between two steps is not
recorded) and end at its last poll; the scheduler polls once more after the pass, so
the generation during the pass is recorded with its step.

State: the step's records, the time of the last poll, each rank's decode-step count
at it. Only the stream source (stream_source.py) calls it.
"""
from __future__ import annotations

import time

__all__ = ["StreamRecorder"]


class StreamRecorder:
    def __init__(self, node: str, role: str, pool: str | None, background: bool):
        self.node, self.role, self.pool, self.background = node, role, pool, background
        self.records: list[dict] = []
        self.step_began = 0.0
        self.polled_at: float | None = None
        self.decoded: dict[int, int] = {}

    def begin_step(self) -> None:
        self.records, self.step_began = [], time.time()

    def polled(self, began: float, replies: list[dict]) -> None:
        """Record one `stream_poll` call that began at `began` and returned `replies`
        (one per rank)."""
        now = time.time()
        # background: the engine worked since the last poll, or since the step began
        # (the first poll of a run follows its first submit, made in the step)
        since = began if not self.background else max(self.polled_at or 0.0,
                                                      self.step_began)
        for rank, reply in enumerate(replies):
            steps = int(reply.get("counts", {}).get("decode_steps", 0))
            done, self.decoded[rank] = steps - self.decoded.get(rank, 0), steps
            rows = int(reply.get("rows") or 0)  # samples that finished (a count)
            spans = [(max(a, self.step_began), b) for a, b in reply.get("spans") or ()
                     if b > self.step_began] if self.background else []
            for i, (start, end) in enumerate(spans):  # the counts go with the last
                last = i == len(spans) - 1
                self._add(rank, start, end, done if last else 0, rows if last else 0)
            if "spans" in reply and not spans and (done > 0 or rows):
                # decoded between two steps (not on record): the counts, no time
                self._add(rank, self.step_began, self.step_began, done, rows)
            if not spans and "spans" not in reply and (
                    done > 0 or rows or (self.background and reply.get("busy"))):
                self._add(rank, since, now, done, rows)
        self.polled_at = now

    def _add(self, rank: int, start: float, end: float, steps: int, rows: int) -> None:
        last = next((r for r in reversed(self.records) if r["rank"] == rank), None)
        if self.background and last is not None and last["end"] >= start - 1e-6:
            last["end"] = end
            last["decode_steps"] += steps
            last["rows"] += rows
            return
        self.records.append({"node": self.node, "role": self.role, "pool": self.pool,
                             "rank": rank, "start": start, "end": end,
                             "stream": "poll" if self.background else "decode",
                             "decode_steps": steps, "rows": rows})
