"""Small fake roles and graphs for the runtime tests: deterministic, row-wise, fast.

Shipped to Ray workers by value (`cloudpickle.register_pickle_by_value`), the way
the CLI ships graph files, so the workers need not import this test folder.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch

from hybridflow.core.batch import Batch
from hybridflow.plan.compiler import compile_graph
from hybridflow.graph.dispatch import (BROADCAST, DP, DP_TP, ONE_PER_WORKER, RANK_ZERO, Layout,
                                       SlotLayout, method, register_dispatch_mode)
from hybridflow.graph.builder import Graph, node_fn
from hybridflow.plan.placement import Placement, PoolSpec

REVERSED = "reversed_dp"      # a user mode declared as a slot layout
ODD_RANKS = "odd_ranks"       # only odd ranks run, rows split over them


def reversed_slots(layout: Layout) -> SlotLayout:
    """Chunk c of the rows goes to rank world-1-c, and is collected from it."""
    ranks = tuple(reversed(range(layout.world_size)))
    return SlotLayout(layout.world_size, ranks, ranks)


def odd_rank_slots(layout: Layout) -> SlotLayout:
    odd = list(range(1, layout.world_size, 2))
    return SlotLayout(len(odd), tuple(odd.index(r) if r in odd else None
                                      for r in range(layout.world_size)), tuple(odd))


def _register() -> None:
    for name, slots in ((REVERSED, reversed_slots), (ODD_RANKS, odd_rank_slots)):
        try:
            register_dispatch_mode(name, slots=slots)
        except ValueError:  # already registered in this process
            pass


_register()


def prompts(rows: int, width: int = 4, groups: int | None = None, first: int = 0) -> Batch:
    """`rows` prompts; `uid` names one group per prompt (or `groups` interleaved ids)."""
    ids = torch.arange(rows * width, dtype=torch.int64).reshape(rows, width) + first
    uid = [f"u{first + (i % groups if groups else i)}" for i in range(rows)]
    return Batch({"input_ids": ids}, {"uid": uid})


class Base:
    def __init__(self, cfg, ctx):
        self.ctx = ctx

    def getpid(self) -> int:
        return os.getpid()

    def rank_env(self) -> dict:
        return {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                "MASTER_ADDR", "MASTER_PORT")}


class Echo(Base):
    """One method per dispatch mode: x * 2 and the rank that computed each row."""

    def _echo(self, batch: Batch) -> Batch:
        rank = torch.full((len(batch),), self.ctx.rank, dtype=torch.int64)
        out = Batch({"y": batch["input_ids"] * 2, "rank": rank}, meta=batch.meta)
        out.meta = {"metrics": {"echo/rows": float(len(batch))}}
        return out

    @method(dispatch=DP, reads=("input_ids",), writes=("y", "rank"))
    def dp(self, batch):
        return self._echo(batch)

    @method(dispatch=DP_TP, reads=("input_ids",), writes=("y", "rank"))
    def dp_tp(self, batch):
        return self._echo(batch)

    @method(dispatch=RANK_ZERO, reads=("input_ids",), writes=("y", "rank"))
    def rank_zero(self, batch):
        return self._echo(batch)

    @method(dispatch=BROADCAST, reads=("input_ids",), writes=("y", "rank"))
    def broadcast(self, batch):
        return self._echo(batch)

    @method(dispatch=REVERSED, reads=("input_ids",), writes=("y", "rank"))
    def reversed_dp(self, batch):
        return self._echo(batch)

    @method(dispatch=ODD_RANKS, reads=("input_ids",), writes=("y", "rank"))
    def odd_ranks(self, batch):
        return self._echo(batch)

    @method(dispatch=REVERSED, reads=("y",), writes=("z", "rank_z"))
    def relay_reversed(self, batch):
        return Batch({"z": batch["y"] + 1, "rank_z": self._ranks(batch)})

    @method(dispatch=ONE_PER_WORKER, reads=("input_ids",), writes=("y", "rank"))
    def one_per_worker(self, batch):
        return self._echo(batch)

    @method(dispatch=DP_TP, reads=("y",), writes=("z", "rank_z"))
    def relay_tp(self, batch):
        return Batch({"z": batch["y"] + 1, "rank_z": self._ranks(batch)})

    @method(dispatch=RANK_ZERO, reads=("z",), writes=("w", "rank_w"))
    def relay_zero(self, batch):
        return Batch({"w": batch["z"] + 1, "rank_w": self._ranks(batch)})

    @method(dispatch=DP, reads=("w",), writes=("v", "rank_v"))
    def relay_dp(self, batch):
        return Batch({"v": batch["w"] + 1, "rank_v": self._ranks(batch)})

    def _ranks(self, batch):
        return torch.full((len(batch),), self.ctx.rank, dtype=torch.int64)

    @method(dispatch=DP, reads=("input_ids",), writes=("y",))
    def fail_on_rank1(self, batch):
        if self.ctx.rank == 1:
            raise ZeroDivisionError("fake failure in the worker")
        return Batch({"y": batch["input_ids"]})

    @method(dispatch=DP, reads=("input_ids",), writes=("y",))
    def die_on_rank1(self, batch):
        if self.ctx.rank == 1:
            os._exit(3)
        return Batch({"y": batch["input_ids"]})

    @method(dispatch=DP, reads=("input_ids",), writes=("y",))
    def hang(self, batch, seconds: float = 60.0):
        time.sleep(seconds)
        return Batch({"y": batch["input_ids"]})

    @method(dispatch=DP, reads=("input_ids",), writes=("y",))
    def allreduce(self, batch):
        import torch.distributed as dist
        self.ctx.init_distributed()
        total = torch.tensor([self.ctx.rank + 1])
        dist.all_reduce(total)
        return Batch({"y": total.expand(len(batch)).clone()})


# --------------------------------------------------------------------- PPO shape
class Actor(Base):
    @method(dispatch=DP, kind="generate", reads=("input_ids",), writes=("responses",),
            forwards=True)
    def generate(self, batch, n: int = 2, length: int = 8):
        out = batch.repeat(n, interleave=True)
        base = out["input_ids"].sum(-1, keepdim=True).float()
        sample = torch.arange(len(out)).remainder(n).unsqueeze(-1).float()
        out["responses"] = base + sample + torch.arange(length, dtype=torch.float32) / length
        return out

    @method(dispatch=DP, reads=("responses", "uid"), writes=(), forwards=True)
    def keep_even_uids(self, batch):
        """A filter (DAPO-style): keeps the rows whose uid number is even."""
        keep = [i for i, u in enumerate(batch["uid"]) if int(u[1:]) % 2 == 0]
        return batch.take(np.asarray(keep, dtype=np.int64))

    @method(dispatch=DP, reads=("responses",), writes=("old_logp",))
    def logprob(self, batch, sleep: float = 0.0):
        time.sleep(sleep)
        return Batch({"old_logp": -batch["responses"] / 100})

    @method(dispatch=DP, kind="train", reads=("responses", "old_logp", "ref_logp",
                                              "advantages"), writes=())
    def update(self, batch):
        loss = (batch["old_logp"] - batch["ref_logp"]).mean() + batch["advantages"].abs().mean()
        out = Batch()
        out.meta = {"metrics": {"actor/loss": float(loss)}}
        return out


class Reference(Base):
    @method(dispatch=DP, reads=("responses",), writes=("ref_logp",))
    def logprob(self, batch, sleep: float = 0.0):
        time.sleep(sleep)
        return Batch({"ref_logp": -batch["responses"] / 90})


class Critic(Base):
    @method(dispatch=DP, reads=("responses",), writes=("values",))
    def values(self, batch):
        return Batch({"values": batch["responses"].mean(-1)})

    @method(dispatch=DP, kind="train", reads=("values", "advantages"), writes=())
    def update(self, batch):
        out = Batch()
        out.meta = {"metrics": {"critic/loss": float(((batch["values"] - batch["advantages"])
                                                      ** 2).mean())}}
        return out


class Reward(Base):
    @method(dispatch=DP, reads=("responses",), writes=("scores",))
    def score(self, batch, sleep: float = 0.0):
        time.sleep(sleep)
        return Batch({"scores": batch["responses"][:, 0].remainder(7)})


@node_fn(reads=("scores", "uid"), writes=("advantages",), group_by="uid")
def group_advantages(batch: Batch) -> Batch:
    """Score minus the mean score of its uid group (needs whole groups)."""
    uid = np.asarray(batch["uid"])
    scores = batch["scores"]
    adv = torch.empty_like(scores)
    for group in dict.fromkeys(uid.tolist()):
        rows = torch.as_tensor(np.flatnonzero(uid == group))
        adv[rows] = scores[rows] - scores[rows].mean()
    out = Batch({"advantages": adv})
    out.meta = {"metrics": {"adv/mean_abs": float(adv.abs().mean()) if len(adv) else 0.0}}
    return out


@node_fn(reads=("scores",), writes=("score_sum",))
def total_score(batch: Batch) -> Batch:
    """A whole-batch function: runs on the driver."""
    return Batch({"score_sum": batch["scores"].sum().expand(len(batch)).clone()})


@node_fn(reads=("y",), writes=("s",))
def broken_sum(batch: Batch) -> Batch:
    """A whole-batch function that fails (it runs on a worker)."""
    raise KeyError("no such column")


class StatefulBroken:
    """A failing function node that keeps state across steps: it runs on the driver."""
    __name__ = "stateful_broken"
    __hybridflow_fn__ = broken_sum.__hybridflow_fn__

    def __call__(self, batch: Batch) -> Batch:
        raise KeyError("no such column")

    def state_dict(self) -> dict:
        return {}


PPO_BINDINGS = {"actor": Actor, "ref": Reference, "critic": Critic, "reward": Reward}


def ppo_graph(n: int = 2, length: int = 8) -> Graph:
    g = Graph("ppo_fake")
    p = g.source("prompts", keys=("input_ids", "uid"))
    rollout = g.call("actor.generate", p, n=n, length=length)
    old = g.call("actor.logprob", rollout)
    ref = g.call("ref.logprob", rollout)
    values = g.call("critic.values", rollout)
    score = g.call("reward.score", rollout)
    adv = g.fn(group_advantages, rollout, score)
    g.fn(total_score, score)
    g.call("actor.update", rollout, old, ref, adv)
    g.call("critic.update", values, adv)
    return g


def ppo_placement(train: int = 3, aux: int = 1) -> Placement:
    """actor + ref share one pool, critic + reward another (of another size, so data
    is resharded between them): colocation, overlap and resharding in one graph."""
    return Placement({"train": PoolSpec("train", 1, train), "aux": PoolSpec("aux", 1, aux)},
                     {"actor": "train", "ref": "train", "critic": "aux", "reward": "aux"})


def ppo_plan(graph: Graph | None = None, train: int = 3, aux: int = 1):
    return compile_graph(graph or ppo_graph(), PPO_BINDINGS, ppo_placement(train, aux))


def local_ppo_plan(graph: Graph | None = None):
    """The same graph for the local runtime: trained roles need a single rank there."""
    return compile_graph(graph or ppo_graph(), PPO_BINDINGS,
                         Placement.single_pool(PPO_BINDINGS, devices=1))


def call_graph(target: str, name: str = "g", **kwargs) -> Graph:
    g = Graph(name)
    p = g.source("prompts", keys=("input_ids", "uid"))
    g.call(target, p, **kwargs)
    return g


def relay_graph() -> Graph:
    """reversed (4 slots) -> dp_tp (2 slots) -> rank_zero (1 slot) -> dp (2 slots: on
    the tp=2 echo role, a dp call splits over the tp groups)."""
    g = Graph("relay")
    p = g.source("prompts", keys=("input_ids", "uid"))
    a = g.call(f"echo.{REVERSED}", p)
    b = g.call("echo.relay_tp", a)
    c = g.call("echo.relay_zero", b)
    g.call("echo.relay_dp", c)
    return g


ECHO_BINDINGS = {"echo": Echo}


def echo_placement(devices: int = 4, tp: int = 2) -> Placement:
    return Placement({"wide": PoolSpec("wide", 1, devices)}, {"echo": "wide"},
                     {"echo": {"tp": tp}})


def echo_plan(graph: Graph, devices: int = 4, tp: int = 2):
    return compile_graph(graph, ECHO_BINDINGS, echo_placement(devices, tp))


def gather_plan(until: int, max_rounds: int, placement: Placement | None = None):
    """prompts -> generate -> keep_even_uids -> gather (DAPO's dynamic sampling), for
    both runtimes (no training, so several local ranks are allowed)."""
    g = Graph("dynamic_sampling")
    p = g.source("prompts", keys=("input_ids", "uid"))
    rollout = g.call("actor.generate", p)
    kept = g.call("actor.keep_even_uids", rollout, name="kept")
    g.gather(kept, until=until, max_rounds=max_rounds, name="gather")
    return compile_graph(g, PPO_BINDINGS, placement or ppo_placement())


class Drawer:
    """A fresh prompt batch per draw, numbered on from the last."""

    def __init__(self, rows: int, first: int):
        self.rows, self.next = rows, first

    def __call__(self, source: str) -> Batch:
        batch = prompts(self.rows, first=self.next)
        self.next += self.rows
        return batch
