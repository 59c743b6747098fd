"""A fake streaming runtime for the streaming scheduler's tests (shared by
test_streaming_scheduler, test_streaming_filter and test_stream_record): a loader of
uids and an engine whose requests finish in a seeded random order."""
from __future__ import annotations

import functools
import os
import random

import torch

from hybridflow.core.batch import Batch
from hybridflow.plan.streaming_split import ENTRANCE_PREFIX
from hybridflow.program.assemble import prepare
from hybridflow.runtime.common import StepResult
from hybridflow.runtime.outputs import StreamTake
from hybridflow.workers.rollout.stream_store import StreamStore

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N, SIZE, STEPS = 2, 3, 8


@functools.lru_cache(maxsize=None)
def plan_for(k: int, side: str = "auto"):
    """GRPO streaming; `side=auto`: its reward, reference and advantages on the stream
    side (an entrance pass without a filter), `generate_only`: on the train side."""
    return prepare(os.path.join(REPO, "graphs", "grpo.py"),
                   [f"trainer.staleness={k}", "trainer.async_mode=streaming",
                    "trainer.allow_uncorrected_async=true", f"rollout.n={N}",
                    f"data.batch_size={SIZE}", f"actor.mini_batch_size={SIZE * N}",
                    f"trainer.stream_side={side}"], preflight=False).plan


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
    """A runtime with one rollout rank: each request finishes after a random number
    of polls, stamped with the version at which it started, into the rank's real
    `StreamStore` (the rows stay "on the worker"); a pass takes its groups from there
    (a `StreamTake` feed) and is an update."""

    def __init__(self, seed: int, version: int = 0, slow: int = 4):
        self.rng, self.version, self.slow = random.Random(seed), version, slow
        self.flight: list[list] = []  # [uid, polls left, version it started with]
        self.trained: list[list[str]] = []
        self.store = StreamStore()
        self.handed: list[list[str]] = []  # per pass, the stream-side producers taken
        self.joint: list[tuple] = []  # (training pass, 1 on, with an entrance inside; its uids)

    # the executor surface the streaming scheduler's StreamClient uses
    def pool_size(self, pool) -> int:
        return 1

    def value_bytes(self, value) -> int:
        return 0

    def call_each(self, role, method, args_by_rank, **kwargs):
        (args,) = args_by_rank
        return [None if args is None else self.call(method, *args, **kwargs)]

    def call(self, method, *args, **kwargs):
        if method == "stream_submit":
            uids = [str(u) for u in args[0]["uid"]]
            for uid in uids:
                self.flight += [[uid, self.rng.randint(1, self.slow), self.version]
                                for _ in range(kwargs["n"])]
            counts = {u: kwargs["n"] for u in uids}
            self.store.expect(counts)
            return counts
        if method == "stream_poll":
            for req in self.flight:
                req[1] -= 1
            done = [r for r in self.flight if r[1] <= 0]
            self.flight = [r for r in self.flight if r[1] > 0]
            self.store.add(_rows(done) if done else None)
            return {"groups": self.store.report(), "busy": bool(self.flight),
                    "rows": len(done), "counts": {}}
        if method == "stream_start":  # background: polls are the only progress here
            return True
        if method == "stream_abort":
            self.flight = []
            self.store.clear()
            return 0
        raise AssertionError(method)

    def taken(self, feed) -> Batch:
        assert isinstance(feed, StreamTake), feed
        ((rank, uids),) = feed.shards
        assert rank == 0
        return self.store.take(list(uids), feed.leave, feed.producer)

    def run_step(self, feeds, plan=None, skip=frozenset(), draw=None):
        """An entrance pass (its feed reads the groups and leaves them: GRPO's
        stream-side nodes, `entrance`), or a training pass: each buffer takes its
        producer's rows, which must be row-aligned with the samples; a training pass
        may hold an entrance pass too (its feed and nodes named `entrance/...`:
        plan/streaming_split.py `joint_plan`), run after the takes."""
        inside = {n: f for n, f in feeds.items() if n.startswith(ENTRANCE_PREFIX)}
        train = {n: f for n, f in feeds.items() if n not in inside}
        if any(f.leave for f in train.values()):
            return self.entrance(train)
        result = self.train(train)
        if inside:
            self.joint.append((len(self.trained), list(inside.values())[0].shards[0][1]))
            entrance = self.entrance(inside, ENTRANCE_PREFIX)
            result.outputs.update(entrance.outputs)
            result.node_metrics.update(entrance.node_metrics)
        return result

    def train(self, feeds) -> StepResult:
        rows = {f.producer: self.taken(f) for f in feeds.values()}
        batch = rows.pop(None)
        for producer, handed in rows.items():  # each row is its sample's: see entrance
            assert handed[producer].tolist() == _tags(batch), producer
        self.trained.append(list(dict.fromkeys(batch["uid"])))
        self.handed.append(sorted(rows))
        self.version += 1
        return StepResult(outputs={})

    def entrance(self, feeds, at: str = "") -> StepResult:
        """GRPO's stream-side nodes on whole groups: each handed-over node's output is
        one column named after it, a tag of its sample's row (uid and version); `at`:
        their names' prefix (inside a training pass)."""
        (feed,) = feeds.values()
        batch = self.taken(feed)
        tags = torch.tensor(_tags(batch))
        outputs = {at + name: Shards([Batch({name: tags.clone()})])
                   for name in ("grpo_advantages", "ref.logprob")}
        return StepResult(outputs=outputs, node_metrics={
            at + "reward.score": {"reward/score/mean": float(len(batch))}})

    # an entrance pass's rows go back to the store holding the groups
    def node_id(self, plan, node, pool, rank):
        return node.name

    def submit(self, node, method, pool, rank, returns, task, args):
        assert method == "stream_keep"
        role, keep, drop, how, *shards = args
        self.store.keep(shards[0], keep, drop, **how)
        return [None, {}]

    def resolve(self, handles):
        return handles, 0


class Shards:
    """A node output's handles, as the scheduler's NodeOutput holds them."""

    def __init__(self, refs):
        self.refs = refs


def _tags(batch: Batch) -> list[float]:
    return [int(u[1:]) * 100.0 + float(v) for u, v in
            zip(batch["uid"], batch["policy_version"].tolist())]


def _rows(done: list) -> Batch:
    versions = torch.tensor([r[2] for r in done])
    return Batch({"policy_version": versions, "token_versions": versions[:, None],
                  "response_length": torch.ones(len(done))}, {"uid": [r[0] for r in done]})
