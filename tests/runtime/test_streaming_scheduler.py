"""The streaming scheduler's bookkeeping (runtime/streaming.py) against a fake engine
whose requests finish in a seeded random order, several decode polls long: whole
groups only, the admission bound per sample (stale groups generated again, never
trained), at most k + 1 batches' worth of prompts drawn ahead, and checkpoint/resume
at every step losing and repeating no prompt. The real engine and runtimes are
tested in tests/e2e/test_streaming.py; this covers many more interleavings."""
from __future__ import annotations

import functools
import os
import random

import pytest
import torch

from hybridflow.core.batch import Batch
from hybridflow.program.assemble import prepare
from hybridflow.runtime.common import StepResult
from hybridflow.runtime.streaming import StreamingScheduler

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N, SIZE, STEPS = 2, 3, 8


@functools.lru_cache(maxsize=None)
def plan_for(k: int):
    return prepare(os.path.join(REPO, "graphs", "grpo.py"),
                   [f"trainer.staleness={k}", "trainer.async_mode=streaming",
                    "trainer.allow_uncorrected_async=true", f"rollout.n={N}",
                    f"data.batch_size={SIZE}", f"actor.mini_batch_size={SIZE * N}"],
                   preflight=False).plan


class Loader:
    """The PromptLoader's contract: batches of uids u<served>, a state to restore."""
    batch_size = SIZE

    def __init__(self):
        self.served = 0

    def next_batch(self) -> Batch:
        uids = [f"u{self.served + i}" for i in range(SIZE)]
        self.served += SIZE
        return Batch({"input_ids": torch.zeros(SIZE, 1, dtype=torch.long)}, {"uid": uids})

    def state_dict(self) -> dict:
        return {"served": self.served}

    def load_state_dict(self, state: dict) -> None:
        self.served = state["served"]


class FakeStream:
    """A runtime with one rollout role: each request finishes after a random number
    of polls, stamped with the version at which it started; a pass is an update."""

    def __init__(self, seed: int, version: int = 0, slow: int = 4):
        self.rng, self.version, self.slow = random.Random(seed), version, slow
        self.flight: list[list] = []  # [uid, polls left, version it started with]
        self.trained: list[list[str]] = []

    def call_role(self, role, method, *args, **kwargs):
        if method == "stream_submit":
            uids = [str(u) for u in args[0]["uid"]]
            for uid in uids:
                self.flight += [[uid, self.rng.randint(1, self.slow), self.version]
                                for _ in range(kwargs["n"])]
            return [{u: kwargs["n"] for u in uids}]
        if method == "stream_poll":
            for req in self.flight:
                req[1] -= 1
            done = [r for r in self.flight if r[1] <= 0]
            self.flight = [r for r in self.flight if r[1] > 0]
            return [{"rows": _rows(done) if done else None, "busy": bool(self.flight),
                     "counts": {}}]
        if method == "stream_abort":
            self.flight = []
            return [0]
        raise AssertionError(method)

    def run_step(self, feeds, plan=None, skip=frozenset(), draw=None):
        (batch,) = feeds.values()
        self.trained.append(list(dict.fromkeys(batch["uid"])))
        self.version += 1
        return StepResult(outputs={})


def _rows(done: list) -> Batch:
    versions = torch.tensor([r[2] for r in done])
    return Batch({"policy_version": versions, "token_versions": versions[:, None],
                  "response_length": torch.ones(len(done))}, {"uid": [r[0] for r in done]})


def run(k, seed, steps=range(1, STEPS + 1), state=None, slow=4):
    engine = FakeStream(seed, version=steps[0] - 1, slow=slow)
    sched = StreamingScheduler(engine, plan_for(k), Loader(), background=False)
    if state is not None:
        sched.load_state_dict(state, steps[0] - 1)
    results, states = {}, {}
    for step in steps:
        results[step] = sched.step(step, STEPS)
        states[step] = (sched.state_dict(), set(sched.prompts))
    return engine, sched, results, states


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("seed", range(4))
def test_whole_admitted_groups_and_a_bounded_lead(k, seed):
    engine, sched, results, _ = run(k, seed, slow=6)
    for step, uids in enumerate(engine.trained, start=1):
        assert len(uids) == SIZE
        assert results[step].metrics["async/staleness/max"] <= k
    flat = [u for uids in engine.trained for u in uids]
    assert len(flat) == len(set(flat)) == STEPS * SIZE
    assert sched.loader.served <= (STEPS + k) * SIZE + SIZE * sched.requeued


def test_stale_groups_are_generated_again_not_trained():
    engine, sched, results, _ = run(1, 0, slow=12)
    assert sched.requeued > 0
    assert max(r.metrics["async/staleness/max"] for r in results.values()) <= 1


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("save", range(1, STEPS))
def test_resume_after_any_step_loses_and_repeats_no_prompt(k, save):
    whole, _, _, states = run(k, 7)
    state, at_save = states[save]
    resumed, sched, _, _ = run(k, 11, steps=range(save + 1, STEPS + 1), state=state)
    before = [u for uids in whole.trained[:save] for u in uids]
    after = [u for uids in resumed.trained for u in uids]
    trained = before + after
    assert len(trained) == len(set(trained)) == STEPS * SIZE
    assert at_save <= set(after) | set(sched.prompts)  # re-drawn, once
    drawn = {f"u{i}" for i in range(sched.loader.served)}
    assert set(trained) | set(sched.prompts) == drawn  # nothing drawn is lost
