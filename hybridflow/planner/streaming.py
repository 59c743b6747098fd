"""The streaming step of an async run (`trainer.async_mode=streaming`): producer and consumer.

With streaming (hybridflow/runtime/run_long/stream_source.py) the rollout engine generates
continuously and a step trains as soon as the buffer holds its batch of whole groups:
no pass waits for a batch's generation to end, so a step has no barrier between the
two sides. In steady state the run is a producer and a consumer:

- the producer, the **stream side** (the source and the generate node): `produce`
  seconds to generate one batch (the generate node on its pool, costed without the
  per-batch tail: rollout.py), i.e. a rate of `samples / produce` samples a second;
- the consumer, the **train side** (everything else, rewards and reference included):
  `train_side` seconds for one batch (simulated as a synchronous step of its nodes),
  plus the weight push after each update (`push`: the export on the host's pool and
  the load into the rollout's own copy, pipeline.py's sync nodes) and the step's
  fixed driver costs (`fixed`: data, metrics).

The step is then

    rollout apart:   max(produce, train_side + push + fixed, busiest pool)
    rollout folded:  produce + train_side + push + fixed

Apart, the engine loop runs on a thread of its own beside the train calls, so the
slower of the two sets the pace and the other side idles the rest (its busy
fraction, side time / step, says how much); a pool that serves both sides (a
reference beside the rollout) cannot exceed its devices, which the busiest-pool
term charges (its nodes of both sides and its share of the push). Folded (the
rollout shares the actor's module), the runtime polls the engine inline between
train passes: generation and training take turns. Contrast the pipelined step
(pipeline.py): max(sides, busiest pool) + sync, a barrier after every step.

Stateless: schedules are index arrays built once per grouping.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hybridflow.core.modes import AsyncMode

from .pipeline import PipelinedSchedule, seconds_text
from .schedule import NodeTiming

__all__ = ["StreamingSchedule", "StreamingStep", "streaming_step"]


@dataclass(frozen=True)
class StreamingStep:
    """The terms of one plan's streaming step, in seconds (one batch, steady state)."""

    staleness: int
    rollout_side: float  # produce: the stream side's time for one batch
    train_side: float
    pool_busy: dict[str, float] = field(hash=False)  # both sides and the push
    sync: float  # the weight push after each update
    synchronous: float  # the same plan's step at staleness 0 (no overlap), overheads included
    own_weights: dict[str, str] = field(default_factory=dict, hash=False)
    fixed: float = 0.0  # the step's fixed driver costs, on the consumer's side
    inline: bool = False  # the generation shares a trained module: the sides take turns
    samples: int = 0  # samples in one batch
    rollout_pools: tuple[str, ...] = ()  # the pools that run a generate node
    kind = "streaming"  # in words (explain.py); `mode` is the type
    mode = AsyncMode.STREAMING

    @property
    def consume(self) -> float:
        return self.train_side + self.sync + self.fixed

    @property
    def busiest(self) -> tuple[str, float]:
        return max(self.pool_busy.items(), key=lambda item: item[1], default=("", 0.0))

    @property
    def step(self) -> float:
        if self.inline:
            return self.rollout_side + self.consume
        return max(self.rollout_side, self.consume, self.busiest[1])

    @property
    def pool_bound(self) -> bool:
        """Whether a pool's busy time (not a side's chain) sets the step."""
        return not self.inline and self.busiest[1] > max(self.rollout_side, self.consume) + 1e-9

    @property
    def bottleneck(self) -> str:
        """'rollout' or 'train': the side whose devices set the pace; 'both' inline."""
        if self.inline:
            return "both"
        if self.pool_bound:
            return "rollout" if self.busiest[0] in self.rollout_pools else "train"
        return "rollout" if self.rollout_side >= self.consume else "train"

    def busy_fraction(self) -> dict[str, float]:
        """Share of the step each side (and each pool) works."""
        step = self.step or 1.0
        out = {"rollout side": self.rollout_side / step, "train side": self.consume / step}
        out.update({f"pool {p}": s / step for p, s in self.pool_busy.items()})
        return out

    @property
    def bound_by(self) -> str:
        if self.inline:
            return "the two sides in turn (the rollout shares the actor's module)"
        side = self.bottleneck
        if self.pool_bound:
            return (f"pool {self.busiest[0]} busy {seconds_text(self.busiest[1])} s (its "
                    "nodes of both sides and its share of the weight push)")
        if side == "rollout":
            return f"the rollout side (generation, {seconds_text(self.rollout_side)} s)"
        return f"the train side ({seconds_text(self.consume)} s with the push)"

    def rate(self) -> float:
        """Samples a second the stream side produces."""
        return self.samples / self.rollout_side if self.rollout_side > 0 else float("inf")

    def describe(self) -> str:
        train = (f"train side {seconds_text(self.train_side)} + weight push "
                 f"{seconds_text(self.sync)} + fixed {seconds_text(self.fixed)}")
        step = seconds_text(self.step)
        if self.inline:
            return (f"rollout side {seconds_text(self.rollout_side)} + {train} = {step} s "
                    f"(the rollout shares the actor's module: the sides take turns)")
        pools = ", ".join(f"{p} {seconds_text(s)}" for p, s in self.pool_busy.items())
        return (f"max(rollout side {seconds_text(self.rollout_side)}, {train}, pool busy "
                f"[{pools}]) = {step} s, no barrier; set by {self.bound_by}")

    def to_json(self) -> dict:
        return {"mode": self.mode.value, "staleness": self.staleness,
                "rollout_side_s": round(self.rollout_side, 3),
                "train_side_s": round(self.train_side, 3), "push_s": round(self.sync, 3),
                "fixed_s": round(self.fixed, 3), "step_s": round(self.step, 3),
                "pool_busy_s": {p: round(s, 3) for p, s in self.pool_busy.items()},
                "busy_fraction": {k: round(v, 3) for k, v in self.busy_fraction().items()},
                "samples_per_s": round(self.rate(), 3), "inline": self.inline,
                "synchronous_step_s": round(self.synchronous, 3),
                "own_weights": dict(self.own_weights), "bottleneck": self.bottleneck,
                "bound_by": self.bound_by}


class StreamingSchedule(PipelinedSchedule):
    """`StepSchedule`'s interface (makespan, lower_bound) for the streaming step; its
    `makespan` includes the fixed per-step costs (they are on the consumer's side)."""

    def __init__(self, nodes, pool_of_role: dict[str, int], pools: int,
                 rollout_side: frozenset[str], fixed: float):
        super().__init__(nodes, pool_of_role, pools, rollout_side)
        self.fixed = fixed
        trained = {n.role for n in nodes if n.kind.trains}
        self.inline = any(n.kind.generates and n.role in trained
                          for n in nodes if n.name in rollout_side)

    def streaming_terms(self, seconds: list[float]) -> tuple[float, float, list[float], float]:
        """(produce, train side, each pool's busy time with its share of the push, push)."""
        rollout, train, busy, push = self.terms(seconds)
        for i in self.sync:
            busy[self.pool[i]] += seconds[i]
        return rollout, train, busy, push

    def makespan(self, seconds: list[float]) -> float:
        rollout, train, busy, push = self.streaming_terms(seconds)
        consume = train + push + self.fixed
        return rollout + consume if self.inline else max(rollout, consume, *busy)

    def lower_bound(self, seconds: list[float], busy: list[float]) -> float:
        """Each side's dependency chain (the train side's with the push and the fixed
        costs), and each pool's least busy time."""
        chains = [schedule.lower_bound([seconds[i] for i in index], [])
                  for index, schedule in self.sides]
        consume = chains[1] + sum(seconds[i] for i in self.sync) + self.fixed
        if self.inline:
            return chains[0] + consume
        return max(chains[0], consume, *busy)

    def timings(self, seconds: list[float],
                pool_names: list[str]) -> tuple[dict[str, NodeTiming], list[str], tuple]:
        """The stream side from 0; the train side from 0 too (apart: it trains the batch
        generated before) or after the stream side (inline); the push after the train
        side. The critical path is the side (or pool) that sets the step."""
        rollout, train, busy, push = self.streaming_terms(seconds)
        out, paths = {}, []
        for side, (index, schedule) in enumerate(self.sides):
            timings, path = schedule.timings([seconds[i] for i in index], pool_names)
            shift = rollout if self.inline and side == 1 else 0.0
            out.update({n: NodeTiming(t.node, t.pool, t.start + shift, t.end + shift)
                        for n, t in timings.items()})
            paths.append(path)
        start = train + (rollout if self.inline else 0.0)
        for i in self.sync:
            out[self.nodes[i].name] = NodeTiming(self.nodes[i].name, pool_names[self.pool[i]],
                                                 start, start + seconds[i])
            start += seconds[i]
        sync_names = [self.nodes[i].name for i in self.sync]
        consume = train + push + self.fixed
        if self.inline:
            path = paths[0] + paths[1] + sync_names
        elif busy and max(busy) > max(rollout, consume):
            pool = busy.index(max(busy))
            path = [n.name for i, n in enumerate(self.nodes) if self.pool[i] == pool]
        elif rollout >= consume:
            path = paths[0]
        else:
            path = paths[1] + sync_names
        ordered = {n.name: out[n.name] for n in self.nodes}
        return ordered, path, (rollout, train, busy, push)


def streaming_step(schedule: StreamingSchedule, seconds: list[float], pool_names: list[str],
                   staleness: int, synchronous: float, own_weights: dict[str, str],
                   samples: int) -> tuple[dict[str, NodeTiming], list[str], StreamingStep]:
    """The timings, critical path and terms of one plan's streaming step."""
    timings, path, (rollout, train, busy, push) = schedule.timings(seconds, pool_names)
    generating = tuple(dict.fromkeys(timings[n.name].pool for n in schedule.nodes
                                     if n.kind.generates and timings[n.name].pool))
    terms = StreamingStep(staleness, rollout, train, dict(zip(pool_names, busy)), push,
                          synchronous, dict(own_weights), schedule.fixed, schedule.inline,
                          samples, generating)
    return timings, path, terms
