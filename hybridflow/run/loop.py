"""The step loop: data -> plan -> metrics, with validation, checkpoints and resume.

One function reads top to bottom (`Trainer.fit`): draw a batch for every source
node, run the compiled plan on the runtime, log metrics, validate every
`trainer.val_every` steps, checkpoint every `trainer.save_every` steps and at the
end. Nothing here knows which algorithm the graph implements.

status.json is rewritten after every step (state `running`, the step just done), so
it tells how far a run got even after a SIGKILL. A signal guard (signals.py)
lets the step and a checkpoint finish before a signal stops the loop.
"""
from __future__ import annotations

import math
import random
import time
from collections import defaultdict

import numpy as np
import torch

from hybridflow.run.batch_dump import dump_step
from hybridflow.run.busy import busy_fractions
from hybridflow.run.checkpoint import (latest_checkpoint, load_trainer_state, restore_rng,
                                       save_checkpoint)
from hybridflow.run.lifecycle import resume_checkpoint
from hybridflow.plan.compiler import ExecutionPlan
from hybridflow.core.data import PromptDataset, PromptLoader, row_checker, toy_rows
from hybridflow.core.kinds import NodeKind, Op, RowEffect
from hybridflow.core.metric_names import STEP_TIME, TIMING_PREFIX
from hybridflow.core.modes import run_modes
from hybridflow.core.worker_hooks import reports_held_tensors
from hybridflow.program.assemble import LoadedGraph, compile_program
from hybridflow.program.validation import (ScoreSource, ValidationPlan, compile_validation,
                                           default_validation_graph)
from hybridflow.graph.dispatch import merge_metrics
from hybridflow.run.signals import Interrupted, NoSignals
from hybridflow.run.trainer_state import check_against_run, check_trainer_state
from hybridflow.runtime.progress import empty_training_inputs
from hybridflow.runtime.run_long.run_scheduler import make_run_scheduler
from hybridflow.run.tracking import MetricSinks, RunDir
from hybridflow.run.generations import GENERATIONS_FILE, GenerationLog, train_nodes

__all__ = ["Trainer", "NumericsError", "default_validation_graph", "seed_everything"]


class NumericsError(RuntimeError):
    """NaN or inf in a loss, a gradient norm or a reward."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_runtime(plan: ExecutionPlan, cfg, extra_plans=()):
    """The configured runtime, with workers for every role of `plan` and `extra_plans`;
    `cfg` is what the workers receive: the run's typed values (`LoadedGraph.values`).
    Built by the factory registered for `runtime.name` (runtime/factories.py)."""
    from hybridflow.runtime.factories import make_runtime as build
    return build(plan, cfg, cfg.trainer.seed, extra_plans)


def _is_watched(key: str) -> bool:
    return any(word in key for word in ("loss", "grad_norm", "score", "reward"))


def check_finite(step: int, node_metrics: dict[str, dict]) -> None:
    for node, metrics in node_metrics.items():
        for key, value in metrics.items():
            if _is_watched(key) and isinstance(value, float) and not math.isfinite(value):
                raise NumericsError(f"step {step}: node '{node}' produced {key}={value}; "
                                    f"the run stops and the last good checkpoint is kept")


class Trainer:
    def __init__(self, loaded: LoadedGraph, run: RunDir, resume_from: str | None = None,
                 checkpoint: str | None = None):
        """`resume_from`: the run directory to resume (its newest checkpoint, verified,
        or `checkpoint` when the caller has just verified it: lifecycle.py)."""
        self.cfg, self.plan, self.run = loaded.cfg, loaded.plan, run
        self.module = loaded.module
        cfg = self.cfg
        seed_everything(cfg.trainer.seed)
        self.notes: list[str] = []  # lines for the user: rows dropped, what a resume trimmed
        self.train_loader, self.val_loader = self._make_loaders()
        self.validation = self._compile_validation() \
            if cfg.trainer.val_every > 0 or cfg.trainer.val_only else None
        self.val_plan = self.validation.plan if self.validation is not None else None
        self.step, self.saved_step = 0, None
        self.completed = 0  # the last step that finished (self.step is the one under way)
        self.last_result = None  # the last step's StepResult (outputs left on the workers)
        self.resumed_from = None  # what a resume loaded
        self.sinks = None
        extra = [self.val_plan] if self.val_plan is not None else []
        self.runtime = make_runtime(self.plan, loaded.values, extra)
        # what outlives a step: the buffers of an async plan, the batches drawn (a
        # streaming plan's: the engine's requests in flight, the groups finished)
        self.scheduler = make_run_scheduler(self.runtime, self.plan, self.train_loader)
        try:  # the caller gets no trainer to close on failure: stop the workers here
            if resume_from:
                self._resume(checkpoint or resume_checkpoint(self.run))
            self.sinks = MetricSinks(run, cfg.trainer.tensorboard, cfg.trainer.wandb, run.path)
            self.generations = GenerationLog(run.file(GENERATIONS_FILE), self.tokenizer,
                                             self.sinks)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ setup
    def _make_loaders(self) -> tuple[PromptLoader, PromptLoader | None]:
        from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
        cfg = self.cfg
        tok = self.tokenizer = load_tokenizer(tokenizer_spec(cfg.model))
        limit, drop = cfg.data.max_prompt_length, cfg.data.filter_overlong
        check = row_checker(self.plan, cfg)  # values the scorer needs, checked at load
        if cfg.data.train_files:
            train = PromptDataset.from_file(cfg.data.train_files, tok, limit, drop, check)
            val = (PromptDataset.from_file(cfg.data.val_files, tok, limit, drop, check)
                   if cfg.data.val_files else None)
        else:
            toy = cfg.data.toy
            train_rows, val_rows = toy_rows(cfg.trainer.seed, toy.max_operand, toy.test_fraction,
                                             toy.train_on_test, toy.maker)
            train = PromptDataset(train_rows, tok, limit, drop, name="toy train", check_row=check)
            val = PromptDataset(val_rows, tok, limit, drop, name="toy test", check_row=check)
        self._note_dropped(train, val, limit)
        pad = tok.pad_token_id
        gathers = any(n.row_effect is RowEffect.GATHERS  # rounds concatenate
                      for n in self.plan.nodes)
        # streamed samples of many draws meet in one batch (and one group in several
        # polls): every prompt row has the same width
        streams = run_modes(cfg).async_mode.streams
        train_loader = PromptLoader(train, cfg.data.batch_size, pad, cfg.data.shuffle,
                                    cfg.trainer.seed, fixed_width=gathers or streams)
        val_loader = PromptLoader(val, min(len(val), 256), pad, False) if val else None
        return train_loader, val_loader

    def _note_dropped(self, train, val, limit: int) -> None:
        """Rows longer than data.max_prompt_length are dropped and counted: a line at
        start and `data/dropped_overlong_*` in step 1's metrics."""
        self.dropped = {"data/dropped_overlong_train": train.dropped,
                        "data/dropped_overlong_val": val.dropped if val else 0}
        for name, data in (("train", train), ("validation", val)):
            if data is not None and data.dropped:
                self.notes.append(f"{data.name}: dropped {data.dropped} {name} rows longer "
                                  f"than data.max_prompt_length={limit} (kept {len(data)}); "
                                  f"set data.filter_overlong=false to fail on them instead")

    def _compile_validation(self) -> ValidationPlan | None:
        if self.val_loader is None:
            return None
        return compile_validation(self.module, self.cfg, compile_program)

    def sources(self) -> list[str]:
        return [n.name for n in self.plan.nodes if n.op is Op.SOURCE]

    # ------------------------------------------------------------------- loop
    def fit(self, on_step=None, signals=None) -> dict:
        """Train to `trainer.steps`. With a `SignalGuard`, a signal lets the running
        step finish, saves a checkpoint and raises `Interrupted`."""
        cfg, last, signals = self.cfg.trainer, {}, signals or NoSignals()
        signals.grace_s = cfg.stop_timeout_s  # a step that cannot end: bounded stop
        if cfg.val_only:
            return self.validate_only(signals)
        self._set_running()
        first = self.step
        if self.val_plan is not None and self.step == 0:
            with signals.deferred():
                last.update(self.validate())
                self.sinks.log(0, last)
        while self.step < cfg.steps:
            self._stop_if_signalled(signals)
            with signals.deferred():
                last = self._one_step(on_step)
        self._stop_if_signalled(signals)
        if self.step > first and self.val_plan is not None and self.step % cfg.val_every:
            with signals.deferred():  # the last step is validated, whatever val_every
                last = {**last, **self._validate_last()}
        if self.saved_step != self.step:
            with signals.deferred():
                self.save()
        self.run.set_status("finished", step=self.step, steps=cfg.steps)
        return last

    def validate_only(self, signals) -> dict:
        """`trainer.val_only`: the model as loaded (a resumed run's checkpoint, or
        model.path) validated once, logged at its step; nothing trains or is saved."""
        status = self.run.status() if self.resumed_from else None
        self.run.set_status("running", step=self.step, steps=self.cfg.trainer.steps)
        with signals.deferred():
            metrics = self._validate_last()
        state = (status or {}).get("state", "finished")
        self.run.set_status(state if state in ("finished", "interrupted") else "finished",
                            step=self.step, steps=self.cfg.trainer.steps,
                            checkpoint=self.resumed_from, validated=self.step)
        return metrics

    def _validate_last(self) -> dict:
        metrics = self.validate()
        self.sinks.log(self.step, metrics)
        return metrics

    def _one_step(self, on_step) -> dict:
        cfg = self.cfg.trainer
        self.step += 1
        metrics = self.train_step()
        if self.step == 1:  # once a run (a resumed run keeps this line), after
            metrics.update(self.held_bytes())  # an update allocated optimizer state
            metrics.update(self.dropped)
        if self.val_plan is not None and self.step % cfg.val_every == 0:
            metrics.update(self.validate())
        self.sinks.log(self.step, metrics)
        if cfg.save_every and self.step % cfg.save_every == 0:
            self.save()
        self.completed = self.step
        self._set_running()
        if on_step:
            on_step(self.step, metrics)
        return metrics

    def _set_running(self) -> None:
        self.run.set_status("running", step=self.completed, steps=self.cfg.trainer.steps,
                            checkpoint=self.saved_step, resumed_from=self.resumed_from)

    def _stop_if_signalled(self, signals) -> None:
        """Between steps: on a pending signal, save (unless this step is saved) and stop."""
        if signals.pending is None:
            return
        with signals.deferred():
            path = self.save() if self.saved_step != self.step else self.last_saved
        signals.disarm()
        raise Interrupted(signals.pending, saved=path)

    def held_bytes(self) -> dict:
        """`engine/weight_bytes` and `engine/optimizer_bytes`: the tensors every worker
        holds, each storage counted once per process (colocated roles share some)."""
        from hybridflow.workers.base import held_bytes
        plans = [self.plan] + ([self.val_plan] if self.val_plan is not None else [])
        roles = sorted({r for p in plans for r in p.roles
                        if reports_held_tensors(p.bindings[r])})
        return held_bytes([report for role in roles
                           for report in self.runtime.call_role(role, "held_tensors")])

    def train_step(self) -> dict:
        start = time.perf_counter()
        result = self.scheduler.step(self.step, self.cfg.trainer.steps)
        self.last_result = result
        empty_training_inputs(self.step, self.plan, result.rows)  # runtime/progress.py
        if self.step in self.cfg.trainer.dump_batches:  # a documented look at a batch
            dump_step(self.run.path, self.step, self.plan, self.runtime, result)
        if self.cfg.trainer.check_finite:
            check_finite(self.step, result.node_metrics)
        self._log_train_generations(result)
        elapsed = time.perf_counter() - start
        metrics = dict(result.metrics)
        metrics[STEP_TIME] = elapsed
        # the step's wall time, waits for rows included (a pass is `runtime/pass_s`)
        metrics["runtime/step_s"] = elapsed
        metrics["engine/driver_bytes"] = result.driver_bytes
        # each generate node's own mean length times its rows (a gather's extra rounds
        # are not counted: their rows are not kept per round)
        tokens = sum(result.node_metrics.get(n.name, {}).get("response_length/mean", 0.0)
                     * result.rows.get(n.name, 0) for n in self.plan.nodes
                     if n.kind is NodeKind.GENERATE)
        if tokens:
            metrics["perf/throughput"] = tokens / elapsed  # response tokens per second
        metrics.update(busy_fractions(result.timeline, self.runtime.pool_size))
        self.sinks.log_timeline(self.step, result.timeline)
        return metrics

    def _log_train_generations(self, result) -> None:
        nodes = train_nodes(self.plan) if self.cfg.trainer.log_generations else None
        if nodes:
            self.generations.write(self.generations.samples(
                self.runtime, result, *nodes, self.cfg.trainer.log_generations, self.step,
                "train"))

    def validate(self) -> dict:
        """Scores from the nodes the validation graph marks (program/validation.py);
        every node's own metrics too, as `val/<metric>`, merged over the batches."""
        if self.validation is None:
            raise RuntimeError("this run has no validation plan (trainer.val_every=0 and "
                               "trainer.val_only=false): set trainer.val_every=N to validate")
        per_source: dict[str, list] = defaultdict(lambda: [[], defaultdict(list)])
        node_metrics, rows = [], []
        marks = self.validation
        samples, wanted = [], self.cfg.trainer.log_val_generations
        rollout = _generation_node(self.val_plan, marks.greedy.node)
        for batch in self.val_loader.all_batches():
            result = self.runtime.run_step({"prompts": batch}, plan=self.val_plan)
            if rollout is not None and len(samples) < wanted:  # held-out rows are fixed
                samples += self.generations.samples(self.runtime, result, rollout,
                                                    marks.greedy.node, wanted - len(samples),
                                                    self.step, "val")
            for score, source, _ in self._fetch_scores(result, marks.greedy):
                per_source[source][0].append(score)
            if marks.sampled is not None:
                for score, source, uid in self._fetch_scores(result, marks.sampled):
                    per_source[source][1][uid].append(score)
            node_metrics.append({k: v for k, v in result.metrics.items()
                                 if not k.startswith(TIMING_PREFIX)})
            rows.append(len(batch))
        out = {f"val/{k}": v for k, v in merge_metrics(node_metrics, rows).items()}
        out.update(_validation_metrics(per_source, self.cfg.trainer.val_samples))
        self.generations.write(samples, show=True)
        return out

    def _fetch_scores(self, result, source: ScoreSource):
        scores = self.runtime.fetch(result, source.node, ("scores",))["scores"].tolist()
        columns = {}
        for key, writer in source.rows.items():
            columns[key] = list(self.runtime.fetch(result, writer, (key,))[key])
            if len(columns[key]) != len(scores):
                raise RuntimeError(
                    f"validation: node '{source.node}' returned {len(scores)} scores but "
                    f"'{key}' of node '{writer}' has {len(columns[key])} rows; the marked node "
                    f"must keep its input's rows")
        return zip(scores, columns["data_source"], columns["uid"])

    # ------------------------------------------------------------ checkpoints
    def trained_roles(self) -> list[str]:
        return sorted({n.role for n in self.plan.nodes if n.kind.trains})

    def untrained_processes(self) -> list[str]:
        """One role per pool that hosts no trained role: the processes whose random
        generators (e.g. a rollout's sampling) no role checkpoint saves."""
        placed = self.plan.placement.roles
        trained_pools = {placed.get(r) for r in self.trained_roles()}
        first = {}
        for role in self.plan.roles:
            pool = placed.get(role)
            if pool not in trained_pools and role not in self.plan.placement.folded:
                first.setdefault(pool, role)
        return sorted(first.values())

    def stateful_nodes(self) -> list:
        """Function nodes that keep state across steps on the driver (`state_dict()`
        and `load_state_dict()`, e.g. an adaptive KL coefficient): saved with the run."""
        return [n for n in self.plan.nodes if n.op is Op.FN
                and callable(getattr(n.fn, "state_dict", None))]

    def save(self) -> str:
        def save_roles(root: str) -> None:
            for role in self.trained_roles():
                self.runtime.call_role(role, "save_checkpoint", f"{root}/{role}")
            for role in self.untrained_processes():
                self.runtime.call_role(role, "save_process_rng", f"{root}/rng/{role}")
        state = {**self.scheduler.state_dict(),
                 "nodes": {n.name: n.fn.state_dict() for n in self.stateful_nodes()}}
        path = save_checkpoint(self.run.checkpoints, self.step, save_roles, state,
                               keep=self.cfg.trainer.max_checkpoints)
        self.saved_step = self.step
        return path

    @property
    def last_saved(self) -> str | None:
        return latest_checkpoint(self.run.checkpoints)

    def _resume(self, path: str | None) -> None:
        """Load checkpoint `path` (verified); None: the run wrote nothing yet, and
        starts at step 0. Nothing the run wrote is lost: see RunDir.truncate_metrics."""
        if path is None:
            return
        state, torch_rng = load_trainer_state(path, verified=True)
        where = f"{path}/trainer_state.json"  # ... and its contents: run/trainer_state.py
        check_trainer_state(state, where)
        check_against_run(state, where, len(self.train_loader.dataset),
                          {n.name for n in self.stateful_nodes()})
        for role in self.trained_roles():
            self.runtime.call_role(role, "load_checkpoint", f"{path}/{role}")
        for role in self.untrained_processes():
            self.runtime.call_role(role, "load_process_rng", f"{path}/rng/{role}")
        # the loader; the batches buffered at the save are drawn again
        self.scheduler.load_state_dict(state, int(state["step"]))
        for node in self.stateful_nodes():
            if node.name in state.get("nodes", {}):
                node.fn.load_state_dict(state["nodes"][node.name])
        restore_rng(state["rng"], torch_rng)
        from hybridflow.plan.weight_sync import resync_plan
        if (sync := resync_plan(self.plan)) is not None:  # a rollout with its own weights
            self.runtime.run_step({}, plan=sync)            # gets the restored actor's
        self.step = self.saved_step = self.completed = int(state["step"])
        self.resumed_from = path
        # a validation-only look appends its line: the steps after the checkpoint stay
        self.notes += self.run.truncate_metrics(None if self.cfg.trainer.val_only
                                                else self.step)

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()
        self.runtime.shutdown()


def _validation_metrics(per_source: dict, n: int) -> dict:
    out = {}
    for source, (greedy, sampled) in per_source.items():
        out[f"val/{source}/greedy"] = float(np.mean(greedy)) if greedy else 0.0
        if sampled:
            groups = list(sampled.values())
            out[f"val/{source}/mean@{n}"] = float(np.mean([np.mean(g) for g in groups]))
            out[f"val/{source}/best@{n}"] = float(np.mean([max(g) for g in groups]))
    return out


def _generation_node(plan, scored: str) -> str | None:
    """The node whose `responses` the marked validation node scored (for its samples)."""
    node = next((n for n in plan.nodes if n.name == scored), None)
    return None if node is None else node.input_keys.get("responses")
