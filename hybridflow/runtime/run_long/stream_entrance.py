"""The entrance pass of a streaming buffer: each batch of whole groups, as they
complete, runs on the stream side through the nodes after the generate node, where
the groups wait (the rollout workers) — one *entrance pass* per batch of arrivals.

- With a filter (a gather: DAPO's dynamic sampling, plan/stream_filter.py) those are
  the nodes between the generate node and the gather (the rule reward, the penalty,
  the filter). A group the filter keeps enters the buffer with the columns the
  filter's output carries (they replace its samples on the worker); a group it drops
  is rejected (the run scheduler's stream source counts it and consumes its prompt).
- Without a filter they are the stream-side nodes the compiler moved there
  (plan/streaming_split.py `stream_side_nodes`: rule rewards, a colocated reference,
  group advantages). Every group is kept; each node the train side reads (a
  *handed-over* node, read through its own buffer) has its rows of each group held
  beside the group's samples on the worker, row-aligned with them (by position: the
  nodes keep their input's rows one for one), for its buffer to take.

State: the entrance plan (fixed), the scheduler's stream client (`client`: where the
groups wait; rows go back there worker to worker), what the passes since the last
`drain()` reported (each entrance node's metrics per pass, timings, the timeline and
the driver bytes) and, without a filter, `passes`: each pass's metrics with the uids
it ran that are not yet trained. Only its methods change it; the stream source owns
one.
"""
from __future__ import annotations

from hybridflow.core.kinds import Op
from hybridflow.core.metric_names import timing_key
from hybridflow.plan.compiler import ExecutionPlan, PlanNode
from hybridflow.plan.stream_filter import entrance_plan
from hybridflow.plan.streaming_split import ENTRANCE_PREFIX, joint_plan
from hybridflow.runtime.common import sum_round_metrics
from hybridflow.runtime.run_long.stream_buffer import GroupStats

__all__ = ["StreamEntrance"]


class StreamEntrance:
    def __init__(self, runtime, plan: ExecutionPlan, gen: PlanNode, gather: PlanNode | None,
                 staleness: int, unit: str = "uid", names: list[str] | None = None,
                 handed: tuple[str, ...] = (), samples_read: bool = True,
                 stream_side: frozenset = frozenset()):
        """`gather`: the filter's gather (None: no filter, `names` are the stream-side
        nodes and `handed` those the train side reads; `samples_read`: whether a
        train-side buffer takes the samples themselves; `stream_side`: what a step's
        pass skips, the entrance's nodes aside)."""
        self.runtime, self.unit = runtime, unit
        self.plan = entrance_plan(plan, gen, gather, staleness, names)
        if self.plan is None:
            raise ValueError(f"{gather.where()}: it reads '{gen.name}' directly, so "
                             f"there is nothing to screen at the buffer's entrance")
        self.feed = next(n.name for n in self.plan.nodes if n.op is Op.BUFFER)
        self.skip = frozenset(n.name for n in self.plan.nodes
                              if n.op is Op.SOURCE or n.name == gen.name)
        self.out = self.plan.node(gather.deps[0]) if gather is not None else None
        self.handed, self.samples_read = tuple(handed), samples_read
        self.names = [n.name for n in self.plan.nodes if n.name not in self.skip
                      and n.name != self.feed]
        self.client = None  # the scheduler's StreamClient: where the groups wait
        self.passes: list[tuple[set, dict]] = []  # no filter: (uids not trained, metrics)
        # a step's pass with these nodes inside it (`inside`, `absorb`)
        self.joint, self.joint_skip = joint_plan(plan, self.plan, stream_side)
        self._reset()

    def forget(self) -> None:
        """A resumed run: the groups of earlier passes are drawn again."""
        self.passes, self.ahead = [], None
        self._reset()

    def _reset(self) -> None:
        ahead = getattr(self, "ahead", None) or {n: [] for n in self.names}
        self.node_metrics: dict[str, list[dict]] = ahead
        self.ahead: dict[str, list[dict]] = {n: [] for n in self.names}
        self.timing: dict[str, float] = {}
        self.timeline: list[dict] = []
        self.driver_bytes = 0

    def screen(self, groups: list[tuple[str, GroupStats]]) -> tuple[list, list[str]]:
        """(the groups kept, in the order given; the uids dropped), in a pass of their
        own. A filter keeps or drops a group whole; without one every group is kept.
        The groups' rows are read where they wait (the rollout workers) and the
        entrance nodes' rows go back there: only the kept rows' group ids reach the
        driver."""
        uids = [uid for uid, _ in groups]
        feed = self.client.take(uids, leave=True)
        result = self.runtime.run_step({self.feed: feed}, plan=self.plan, skip=self.skip)
        self._record(result, uids)
        return self._settle(result, groups, feed)

    def inside(self, groups: list[tuple[str, GroupStats]]) -> dict:
        """The feed of these groups for a step's pass (`self.joint`, skipping
        `self.joint_skip`): the entrance's nodes run in it, beside the train side;
        `absorb` its result."""
        self._inside = (groups, self.client.take([u for u, _ in groups], leave=True))
        return {ENTRANCE_PREFIX + self.feed: self._inside[1]}

    def absorb(self, result) -> tuple[list, list[str]]:
        """`screen`'s answer for the groups a step's pass ran (`inside`); the
        entrance's parts leave the pass's result (its metrics, rows and timeline are
        the stream side's, reported with the groups' step), its driver bytes stay."""
        (groups, feed), self._inside = self._inside, None
        self._record(result, [uid for uid, _ in groups], ENTRANCE_PREFIX)
        return self._settle(result, groups, feed, ENTRANCE_PREFIX)

    def _settle(self, result, groups: list, feed, at: str = "") -> tuple[list, list[str]]:
        """The verdict or the hand-over; `at`: the prefix of the entrance's nodes'
        names in `result` (a step's pass: joint_plan)."""
        if self.out is None:
            self._hand_over(result, feed, dict(groups), at)
            return list(groups), []
        passed, dropped = self._verdict(result, groups, at)
        shards = _handle(result, at + self.out.name).refs
        self.client.keep(self.plan, self.plan.node(self.feed), shards,
                         [uid for uid, _ in passed], dropped)
        return passed, dropped

    def _verdict(self, result, groups: list, at: str) -> tuple[list, list[str]]:
        """The filter's verdict on each group, read from its output's group ids."""
        ids = self.runtime.fetch(result, at + self.out.name, (self.unit,))
        count: dict[str, int] = {}
        for uid in ids[self.unit]:
            count[str(uid)] = count.get(str(uid), 0) + 1
        passed, dropped = [], []
        for uid, stats in groups:
            if uid not in count:
                dropped.append(uid)
                continue
            if count[uid] != stats.rows:
                raise RuntimeError(
                    f"{self.out.where()}: streaming screens whole groups at the buffer's "
                    f"entrance, but this node kept {count[uid]} of the {stats.rows} "
                    f"samples of {self.unit} {uid!r}; keep or drop a group whole (as "
                    f"drop_uniform_groups does) or set trainer.async_mode=pipeline")
            passed.append((uid, stats))
        return passed, dropped

    def _hand_over(self, result, feed, stats: dict, at: str) -> None:
        """Each handed-over node's rows of the groups to the workers holding them,
        beside the samples (laid out as the feed read them: rank by rank, group by
        group); the samples go when no train-side buffer reads them."""
        layout = [(uid, stats[uid].rows) for _, uids in feed.shards for uid in uids]
        uids = [uid for uid, _ in layout]
        for i, name in enumerate(self.handed):
            last = i == len(self.handed) - 1
            self.client.keep(self.plan, self.plan.node(self.feed),
                             _handle(result, at + name).refs, uids, [], producer=name,
                             layout=layout, drop_samples=last and not self.samples_read)

    def _record(self, result, uids: list[str], at: str = "") -> None:
        """What a pass reported of the entrance's nodes (`at`: the prefix of their
        names in a step's pass, whose result they then leave: there they are the
        stream side's, reported with the step that trains the groups; its driver
        bytes stay the pass's)."""
        # (a metric named after its node, perf/mfu/<node>, under the node's own name)
        metrics = {n: {k.replace(at + n, n) if at else k: v
                       for k, v in result.node_metrics[at + n].items()}
                   for n in self.names if at + n in result.node_metrics}
        if self.out is None:  # reported with the step that trains these groups
            self.passes.append((set(uids), metrics))
        # a filter's verdict inside a step's pass is on the next step's groups: its
        # metrics are that step's, as its drops are (stream_source.py)
        rounds = self.ahead if at and self.out is not None else self.node_metrics
        for name, values in metrics.items():
            rounds[name].append(values)
        for name in self.names:
            key = timing_key(at + name)
            if key in result.metrics:
                self.timing[timing_key(name)] = self.timing.get(timing_key(name), 0.0) + \
                    result.metrics[key]
        # the feed's driver span is no node of the run's plan (render reads plan.json)
        ours = {at + n: n for n in self.names}
        self.timeline += [{**e, "node": ours[e["node"]]} for e in result.timeline
                          if e["node"] in ours]
        if not at:
            self.driver_bytes += result.driver_bytes
            return
        ours[at + self.feed] = self.feed
        result.timeline[:] = [e for e in result.timeline if e["node"] not in ours]
        for name in ours:
            result.node_metrics.pop(name, None)
            result.rows.pop(name, None)
            result.metrics.pop(timing_key(name), None)

    def drain(self, trained: list[str] = ()) -> tuple[dict, dict, list, int]:
        """(per entrance node its metrics, the step's metrics of them, the timeline and
        driver bytes of the passes since the last drain); then forgets them. The node
        metrics: with a filter, of the passes since the last drain (what it screened
        meanwhile, as DAPO's gather reports its rounds); without one, of the passes
        that ran the `trained` groups (a step's reward is its batch's, the mean over
        those passes)."""
        rounds = self.node_metrics
        if self.out is None:
            trained = set(trained)
            ran = [m for uids, m in self.passes if uids & trained]
            rounds = {n: [m[n] for m in ran if n in m] for n in self.names}
            self.passes = [(uids - trained, m) for uids, m in self.passes if uids - trained]
        node_metrics = {n: sum_round_metrics(m) for n, m in rounds.items() if m}
        metrics = {k: v for m in node_metrics.values() for k, v in m.items()}
        out = node_metrics, {**metrics, **self.timing}, self.timeline, self.driver_bytes
        self._reset()
        return out


def _handle(result, name: str):
    """A node's `NodeOutput` in a step's result (the local runtime wraps outputs)."""
    outputs = result.outputs
    return outputs.handle(name) if hasattr(outputs, "handle") else outputs[name]
