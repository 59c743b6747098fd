"""A fake streaming runtime for the streaming scheduler's tests (shared by
test_streaming_scheduler, test_streaming_filter and test_stream_record): a loader of
uids and an engine whose requests finish in a seeded random order."""
from __future__ import annotations

import functools
import os
import random

import torch

from hybridflow.core.batch import Batch
from hybridflow.program.assemble import prepare
from hybridflow.runtime.common import StepResult

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
