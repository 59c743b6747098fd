"""The run scheduler's source of samples for a streaming plan (`trainer.async_mode=
streaming`, plan/streaming_split.py; run_scheduler.py has the step loop): the rollout
engine generates continuously, samples wait on the rollout workers as they finish,
and a step trains as soon as the buffer holds `data.batch_size` admissible whole
groups. No pass waits for a batch's generation to end.

A step, "submit what is ready":
1. top up: while the prompts drawn and not consumed (in flight or buffered) leave
   room for a batch — at most (k + 1) batches' worth — and the run still needs them, draw
   a batch and submit it to the rollout role (`stream_submit`; a resumed run skips the
   prompts its checkpoint says were consumed);
2. take: the first `batch_size` whole groups the buffer admits (stream_buffer.py:
   each sample's oldest token sampled by weights >= the trained version - k); stale
   groups are submitted again;
3. if none: poll the engine (`stream_poll`, stream_client.py) — on the local runtime
   that runs `rollout.stream_poll_steps` decode steps inline, so decoding and training
   interleave in a fixed order and a seed gives the same rows the same versions; on
   Ray with the rollout on its own pool the engine loop runs on the rollout worker's
   own thread (`stream_start`) while train calls go to the other workers, and a poll
   waits on the worker (up to `POLL_WAIT_S`) until a group is whole: the driver does
   not spin. A poll reports groups, not rows: the samples stay on the rollout workers
   (workers/rollout/stream_store.py). With stream-side nodes after the generate
   node (plan/streaming_split.py: rewards, a colocated reference, group advantages)
   the groups that became whole run through them in an entrance pass
   (stream_entrance.py), all kept, their rows held beside the samples on the
   workers. With an entrance filter (a gather: DAPO's
   dynamic sampling, plan/stream_filter.py) the groups that became whole run through
   it (stream_entrance.py): the kept ones enter the buffer, the dropped ones are
   counted (`<gather>/extra_rounds`) and their prompts consumed, so step 1 draws more
   in their place — then back to 1 (a step that saw more than `max_rounds` batches'
   worth of groups dropped takes the kept groups it holds: DAPO's bound, the gather's
   `DrawBound` (runtime/draw_bound.py, as its rounds use it); holding none once the
   groups in flight at the step's start and `max_rounds + 1` batches' worth more were
   dropped, the run stops: progress.py);
4. one pass of the plan with the stream side skipped and each buffer fed its
   producer's rows of the taken groups (a `StreamTake` each: the pass takes them from
   the rollout workers, worker to worker): the train side's nodes (log-probs, the
   updates, the weight sync, and whatever did not move to the stream side) run on
   them. New weights reach the engine while its requests are in flight (the
   colocated engine's module is the actor's; a rollout with its own weights loads
   them between two decode steps): `rollout.partial` says whether those continue or
   restart.

Nothing lost, nothing twice: each draw is recorded in the run scheduler's `Draws`
(draws.py: the one checkpoint state) with its prompts' uids; a prompt is consumed when
its group is trained or dropped by the entrance filter, so a resume re-draws exactly
the in-flight and buffered prompts, once, and never a dropped one.

State (only its methods change it): `ledger` (the buffer: which groups are whole,
with their numbers), `client` (where each group is held, the bytes the stream's calls
moved through the driver), `prompts` (uid -> the prompt row, for each prompt drawn
and not consumed), the engine's counters, the groups requeued and filtered, `record`
(the stream side's timeline records of the step, stream_record.py: with the engine on
its own thread, one more poll after the pass records what it did meanwhile); the
entrance pass's metrics (its own state).
"""
from __future__ import annotations

import time

from hybridflow.core.batch import Batch
from hybridflow.core.kinds import NodeKind, Op
from hybridflow.core.metric_names import SAMPLED_VERSION
from hybridflow.core.modes import RuntimeName
from hybridflow.plan.async_split import sides_of
from hybridflow.plan.compiler import ExecutionPlan
from hybridflow.plan.stream_filter import groups_per_step
from hybridflow.plan.streaming_split import stream_buffer, stream_buffers
from hybridflow.runtime.draw_bound import DrawBound
from hybridflow.runtime.run_long.draws import Draws
from hybridflow.runtime.run_long.stream_buffer import GroupBuffer
from hybridflow.runtime.run_long.stream_client import StreamClient
from hybridflow.runtime.run_long.stream_entrance import StreamEntrance
from hybridflow.runtime.run_long.stream_record import StreamRecorder

__all__ = ["StreamSource", "POLL_WAIT_S"]

# A background poll waits on the worker up to this long; it returns as soon as a group
# is whole or the engine goes idle, so the bound only caps how often an idle-looking
# wait reports (each reply crosses the driver: fewer, longer waits move fewer bytes).
POLL_WAIT_S = 1.0


class StreamSource:
    synchronous = False

    def __init__(self, runtime, plan: ExecutionPlan, loader, draws: Draws,
                 background: bool | None = None):
        self.runtime, self.plan, self.loader, self.draws = runtime, plan, loader, draws
        self.buffer = stream_buffer(plan)
        spec = self.buffer.buffer
        self.rollout_side = frozenset(sides_of(plan).rollout)
        self.gen = next(n for n in plan.nodes if n.name in self.rollout_side
                        and n.kind is NodeKind.GENERATE)
        self.k, self.size = spec.max_staleness, loader.batch_size
        producer = plan.node(spec.producer)
        self.gather = producer if producer.op is Op.GATHER else None
        # each buffer the train side reads, with whose rows of a group it takes
        samples = (self.gen.name, self.gather.name if self.gather else self.gen.name)
        self.buffers = {b.name: None if b.buffer.producer in samples else b.buffer.producer
                        for b in stream_buffers(plan)}
        self.entrance = None  # the entrance pass (stream_entrance.py), if any
        self.draw_bound = None  # DAPO's, with an entrance filter: a round = a step's groups
        if self.gather is not None:
            self.size = groups_per_step(self.gen, self.gather)
            if spec.screened_by:
                self.draw_bound = DrawBound.of(self.gather, self.size)
                self.entrance = StreamEntrance(runtime, plan, self.gen, self.gather, self.k,
                                               spec.unit or "uid",
                                               stream_side=self.rollout_side)
        else:
            self.entrance = self._stream_side(plan, spec.unit or "uid")
        self.options = {k: v for k, v in self.gen.kwargs.items() if v is not None}
        self.client = StreamClient(runtime, plan, self.gen)
        if self.entrance is not None:
            self.entrance.client = self.client
        if background is None:  # an engine loop of its own needs a process of its own
            background = RuntimeName.of(runtime.name).process_per_rank and \
                self.gen.role not in plan.placement.folded
        self.background, self.started = background, False
        self.record = StreamRecorder(self.gen.name, self.gen.role,
                                     plan.placement.roles.get(self.gen.role), background)
        self.ledger = GroupBuffer(spec.unit or "uid", screened=self.entrance is not None)
        self.prompts: dict[str, Batch] = {}
        self.counts: dict = {}
        self.requeued = self.filtered = self.drawn = 0  # drawn: batches drawn, ever
        self.last_filtered: list[str] = []  # the uids the entrance dropped in the last step
        self.pass_plan, self.joint = plan, False  # the plan of the step's pass; entrance in it
        self.last = False  # the step is the run's last
        self.ahead_dropped = 0  # dropped in a step's pass: counted with the next step
        self.screens = {"inside": 0, "apart": 0}  # groups screened in the step's pass, or not

    def _stream_side(self, plan: ExecutionPlan, unit: str) -> StreamEntrance | None:
        """The entrance pass of the stream-side nodes after the generate node (no
        filter: plan/streaming_split.py `stream_side_nodes`), None without any."""
        names = [n.name for n in plan.nodes if n.name in self.rollout_side
                 and n.op is not Op.SOURCE and n.name != self.gen.name]
        if not names:
            return None
        handed = tuple(p for p in self.buffers.values() if p is not None)
        samples_read = None in self.buffers.values()
        return StreamEntrance(self.runtime, plan, self.gen, None, self.k, unit, names,
                              handed, samples_read, self.rollout_side)

    def resumed(self, step: int) -> None:
        self.ledger.clear()
        self.client.forget()
        if self.entrance is not None:
            self.entrance.forget()
        self.prompts.clear()

    # ------------------------------------------------------------------ steps
    def begin(self, step: int) -> None:
        self.record.begin_step()
        if self.background and not self.started:
            self.client.start()
        self.started = True
        self.began, self.drawn_at = time.perf_counter(), self.drawn
        self.filtered_at, self.ahead_dropped = self.filtered - self.ahead_dropped, 0
        self.screens = {"inside": 0, "apart": 0}  # groups screened in the step's pass, or not
        # the progress rule: at most this many groups dropped, none kept
        self.bound = self.draw_bound.limit(len(self.prompts)) if self.draw_bound else None
        self.last_filtered = []

    def ready(self, step: int, last_step: int, trained: int) -> list | None:
        """Top up the prompts in flight; the first `size` whole groups the ledger admits
        for `step`'s update (stale ones are generated again), or None."""
        self._top_up(step, last_step)
        self.last = step >= last_step  # no later step: nothing to screen beside it
        # DAPO's bound on the extra draws: past it, train the kept groups held
        short = self.draw_bound is not None and \
            self.draw_bound.spent(self.filtered - self.filtered_at)
        taken, stale = self.ledger.take(self.size, trained, self.k, short=short)
        self._resubmit(stale)
        if not taken:
            return None
        self.wait_s = time.perf_counter() - self.began
        return taken

    def generates(self, step: int, last_step: int) -> bool:
        return False  # the engine generates between and during passes, not in them

    def wait(self, step: int) -> None:
        """Nothing to train yet: screen the groups that arrived whole (in a pass of
        their own: the step needs them now), else poll (on Ray, blocking on the worker
        up to POLL_WAIT_S), after checking that the step can still train at all."""
        if self.entrance is not None and self.ledger.arrived:
            self._screen()
            return
        self._check_progress(step, self.filtered - self.filtered_at, self.bound,
                             self.drawn - self.drawn_at)
        self._poll(POLL_WAIT_S if self.background else 0.0,
                   want=self.size - self.ledger.held())

    def feeds(self, taken, generate: bool) -> tuple[dict, frozenset, None]:
        """Each buffer is fed its producer's rows of the taken groups (worker to
        worker: a `StreamTake` each). Groups that arrived whole and wait to be
        screened run through the entrance's nodes inside this pass, beside the
        train side (`pass_plan`: the joint plan, stream_entrance.py)."""
        uids = [uid for uid, _ in taken]
        feeds = dict(zip(self.buffers, self.client.takes(uids, list(self.buffers.values()))))
        self.joint = self.entrance is not None and bool(self.ledger.arrived) and \
            not self.last
        if not self.joint:
            self.pass_plan = self.plan
            return feeds, self.rollout_side, None
        self.pass_plan = self.entrance.joint
        groups = self.ledger.arrivals()
        self.screens["inside"] += len(groups)
        feeds.update(self.entrance.inside(groups))
        return feeds, self.entrance.joint_skip, None

    def after_pass(self, result, generate: bool) -> None:
        if self.joint:  # the groups screened beside training: the next step's
            filtered = self.filtered
            self._settle(*self.entrance.absorb(result))
            self.ahead_dropped += self.filtered - filtered
            self.joint = False
        if self.background:  # what the engine's thread did during the pass, on record;
            # the groups it finished wait to be screened inside the next step's pass
            self._poll(0.0, strict=False, screen=False)

    def trained(self, step: int, last_step: int, taken: list) -> None:
        self._consumed([uid for uid, _ in taken])
        if step >= last_step:
            self.client.abort()

    def _check_progress(self, step: int, dropped: int, bound: int | None,
                        draws: int) -> None:
        """The progress rule (progress.py): the groups in flight when the step began
        and those of `max_rounds + 1` batches more all dropped by the entrance filter,
        none kept: the step cannot train."""
        if bound is None or self.ledger.held() or dropped < bound:
            return
        raise self.draw_bound.no_progress(step, self.entrance.out.where(), dropped, dropped,
                                          draws, "groups", self.entrance.out.name)

    def _top_up(self, step: int, last_step: int) -> None:
        needed = (last_step - step + 1) * self.size  # groups the run still trains
        while len(self.prompts) <= self.k * self.size and len(self.prompts) < needed:
            state = self.loader.state_dict()
            batch = self.loader.next_batch()
            keep = self.draws.skipped(batch["uid"])
            if not keep:
                continue
            batch = batch.take(keep)
            uids = [str(u) for u in batch["uid"]]
            self.draws.record(state, uids)
            self.drawn += 1
            self.prompts.update({u: batch.take(i) for i, u in enumerate(uids)})
            self._submit(batch)

    def _submit(self, batch: Batch) -> None:
        self.ledger.expect(self.client.submit(batch, **self.options))

    def _resubmit(self, stale: list[str]) -> None:
        """Stale groups: their prompts are generated again (never trained stale)."""
        if stale:
            self.requeued += len(stale)
            self._submit(Batch.concat([self.prompts[u] for u in stale]))

    def _poll(self, wait_s: float, strict: bool = True, want: int = 1,
              screen: bool = True) -> bool:
        """The groups that became whole into the ledger; False when none did. Raises
        when nothing is in flight and the buffer cannot fill (a defect, not a wait)."""
        arrived, busy, counts = False, False, {}
        began = time.time()
        replies = self.client.poll(wait_s, want)
        self.record.polled(began, replies)  # the stream side's timeline (stream_record.py)
        for reply in replies:
            busy = busy or reply["busy"]
            counts = _summed(counts, reply["counts"])
            if reply["groups"]:
                self.ledger.add(reply["groups"])
                arrived = True
        self.counts = counts
        if screen and self.entrance is not None and self.ledger.arrived:
            self._screen()
        # (a poll reads the store and `busy` under one lock)
        if strict and not arrived and not busy:
            raise RuntimeError(
                f"streaming: the buffer holds {self.ledger.held()} whole group(s) of the "
                f"{self.size} a step needs and the rollout has nothing in flight "
                f"({len(self.prompts)} prompt(s) drawn and not trained)")
        return arrived

    def _screen(self) -> None:
        """The whole groups that arrived, through the entrance filter: the kept ones
        join the buffer, the dropped ones are counted and their prompts consumed
        (more are drawn in their place, none drawn again)."""
        groups = self.ledger.arrivals()
        self.screens["apart"] += len(groups)
        self._settle(*self.entrance.screen(groups))

    def _settle(self, kept: list, dropped: list[str]) -> None:
        self.ledger.settle(kept, dropped)
        self.filtered += len(dropped)
        self.last_filtered += dropped
        self._consumed(dropped)

    def _consumed(self, uids: list[str]) -> None:
        """Trained or dropped: no longer drawn and not trained, never drawn again."""
        for uid in uids:
            self.prompts.pop(uid, None)
        self.draws.consume(uids)

    # ---------------------------------------------------------------- results
    def rollout_parts(self, taken: list) -> tuple[dict, dict, dict, list, int]:
        """(stream-side node -> its metrics, rows, the stream's own metrics, the stream
        side's timeline, driver bytes) for the groups trained — all from the numbers
        the workers reported (the rows never came here)."""
        groups = [stats for _, stats in taken]
        rows = sum(g.rows for g in groups)
        gen = {**self._engine_time(),
               "response_length/mean": sum(g.length_sum for g in groups) / rows,
               SAMPLED_VERSION: float(min(g.min_version for g in groups)),
               "rollout/stream_wait_s": self.wait_s}
        extra = {"async/requeued_groups": float(self.requeued),
                 **{f"async/stream/{k}": float(v) for k, v in self.counts.items()}}
        node_metrics, timeline, driver_bytes = {self.gen.name: gen}, [], 0
        if self.entrance is not None:
            entrance, timing, timeline, driver_bytes = self.entrance.drain(
                [uid for uid, _ in taken])
            node_metrics.update(entrance)
            extra.update(timing)
            # how many groups went through the stream side's nodes beside training
            # (inside the step's pass) and how many in passes of their own
            extra.update({f"async/entrance/{k}_groups": float(v)
                          for k, v in self.screens.items()})
        if self.gather is not None:  # DAPO's names, as the pipelined gather reports them
            dropped = self.filtered - self.filtered_at - self.ahead_dropped
            node_metrics[self.gather.name] = {
                f"{self.gather.name}/extra_rounds": dropped / self.size,
                f"{self.gather.name}/short_rows": float((self.size - len(groups))
                                                        * groups[0].rows)}
        return (node_metrics, {self.gen.name: rows}, extra,
                timeline + self.record.records, driver_bytes + self.client.drain())

    def _engine_time(self) -> dict:
        """The generate node's metrics a synchronous step reports, for the stream's
        work since the last step (the engines' counters are cumulative, summed over
        ranks): seconds decoding and refreshing weights, response tokens a second."""
        now = {k: float(self.counts.get(k, 0.0)) for k in ("gen_s", "sync_s", "tokens")}
        last = getattr(self, "_timed", None) or {k: 0.0 for k in now}
        self._timed = now
        if "gen_s" not in self.counts:  # a stream that does not time itself (agents)
            return {}
        gen_s, tokens = now["gen_s"] - last["gen_s"], now["tokens"] - last["tokens"]
        return {"rollout/weight_sync_s": now["sync_s"] - last["sync_s"],
                "rollout/gen_s": gen_s,
                "rollout/tokens_per_s": tokens / gen_s if gen_s > 0 else 0.0}

    def ahead(self) -> int:
        """Prompts drawn and not trained (groups in flight or buffered)."""
        return len(self.prompts)


def _summed(a: dict, b: dict) -> dict:
    return {k: a.get(k, 0) + b.get(k, 0) for k in set(a) | set(b)}
