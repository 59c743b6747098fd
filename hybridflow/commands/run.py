"""`hybridflow run graph.py [key=value ...] [--config f.yaml] [--runtime local|ray]
[--address ADDR] [--resume [RUN_DIR]]`: train, writing everything to a run directory.

The process owns the run directory while it trains (run/lock.py); SIGTERM and
SIGHUP stop it like Ctrl-C (run/signals.py); every way it ends is recorded in
status.json (run/lifecycle.py), and a resume is checked before anything is written."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback


from hybridflow.commands.args import NEWEST, add_run_arguments, resume_word, run_overrides
from hybridflow.commands.errors import failure_reason, report, user_errors
from hybridflow.commands.resume import graph_and_trainer, resume_dir, resumed_program
from hybridflow.core.failure_text import cause_line
from hybridflow.plan.compiler import GraphError
from hybridflow.program.config import ConfigError
from hybridflow.core.data import DataError
from hybridflow.core.origin import contain
from hybridflow.core.metric_names import OPTIMISED_REWARD_KEYS
from hybridflow.core.loading import UserFileError
from hybridflow.program.assemble import GraphFileError, prepare
from hybridflow.program.run_record import PLAN_FILE, plan_record
from hybridflow.run.lifecycle import (explicit_keys, graph_identity, record_end,
                                      resume_checkpoint)
from hybridflow.run.lock import RunLock
from hybridflow.run.signals import Interrupted, SignalGuard
from hybridflow.run.tracking import RunDir, RunDirError, new_run_dir
from hybridflow.core.printable import echo, printable

__all__ = ["add_parser", "run"]
_NEWEST = NEWEST


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("run", help="train with a graph file")
    add_run_arguments(parser)  # the arguments `check` takes too
    return parser


_overrides = run_overrides


def _run_dir(args, loaded) -> RunDir:
    """A new run's directory (a resume's: commands/resume.py)."""
    trainer = loaded.cfg.trainer
    try:
        return new_run_dir(trainer.runs_dir, loaded.graph.name, trainer.run_name)
    except OSError as err:
        raise RunDirError(f"trainer.runs_dir={trainer.runs_dir!r}: cannot create a run "
                          f"directory in it: {err.strerror} ({err.filename})") from None


def _before_launch(args, loaded) -> None:
    """A note when the sizes are still the toy's; a CPU run whose predicted memory
    does not fit this machine is refused (ConfigError) before any worker starts."""
    from hybridflow.program.toy_defaults import toy_defaults_note
    note = toy_defaults_note(loaded.cfg, explicit_keys(_overrides(args), args.config))
    if note and not args.resume:
        _say(f"note: {note}")
    if loaded.cfg.model.dtype == "auto":  # say what the machine chose, once
        from hybridflow.workers.models import resolve_dtype
        chosen = str(resolve_dtype("auto")).removeprefix("torch.")
        why = "bf16 is native here" if chosen == "bfloat16" else "bf16 is not native here"
        _say(f"note: model.dtype=auto -> {chosen} ({why})")
    if not loaded.cfg.trainer.check_memory:
        return
    from hybridflow.memory.report import launch_memory_problems
    problems = launch_memory_problems(loaded.cfg, loaded.plan)
    if problems:
        raise ConfigError("; ".join(problems) + " (`hybridflow check --memory` shows the "
                          "prediction; trainer.check_memory=false starts anyway)")


def run(args) -> int:
    resume_word(args)
    with SignalGuard() as signals:  # SIGTERM and SIGHUP stop a run like Ctrl-C
        try:  # everything that can be checked before a worker starts
            if args.resume:  # checked against the run's own config, once found: resume.py
                name, trainer = graph_and_trainer(args.graph, _overrides(args), args.config)
                loaded, record = name, None
                run_dir = resume_dir(args.resume, args.resume == _NEWEST, name, trainer)
            else:
                loaded = prepare(args.graph, _overrides(args), args.config)
                refuse_untrained(loaded.plan, args.graph)
                _before_launch(args, loaded)
                record = plan_record(loaded.plan, loaded.cfg)  # reads the models' shapes
                run_dir = _run_dir(args, loaded)
        except (GraphError, ConfigError, GraphFileError, DataError, UserFileError,
                FileNotFoundError) as err:
            echo(f"hybridflow run: {err}", file=sys.stderr)
            return 1
        lock = RunLock(run_dir.path)
        lock.acquire(say=_say)  # before anything in the directory is read for a resume
        try:
            return _locked_run(args, loaded, run_dir, signals, record)
        except BaseException as err:  # noqa: BLE001 - the net: see _unrecorded
            return _unrecorded(run_dir, err, signals)
        finally:
            lock.release()


def raised_by_code(err: BaseException, signals) -> bool:
    """A KeyboardInterrupt that no signal caused: while the guard holds SIGINT, a
    Ctrl-C arrives as its `Interrupted`, so a bare one was raised by code (an
    environment, a scorer, a function node) and is that code's failure, not the
    user's Ctrl-C (issue 26)."""
    return (isinstance(err, KeyboardInterrupt) and not isinstance(err, Interrupted)
            and signals.pending is None and signals.holds(signal.SIGINT))


def refuse_untrained(plan, graph: str) -> None:
    """A run trains: a graph with no training node would run its steps, learn nothing
    and exit 0 (verl and TRL always update). `hybridflow check` still draws it."""
    if not any(n.kind.trains for n in plan.nodes):
        raise GraphFileError(f"graph {plan.graph_name!r} ({graph}) has no training node: a run "
                             f"would learn nothing; add one (e.g. g.call('actor.update', "
                             f"...)), or inspect the graph with `hybridflow check {graph}`")


def _say(text: str) -> None:
    echo(f"hybridflow run: {text}", file=sys.stderr)


def _resumed(args, graph_name: str, run_dir: RunDir):
    """(the program, its checkpoint) of a resume: the run's config plus this command
    line, through every check of a fresh run; the checkpoint verified (None: the run
    wrote nothing yet). A refusal is one line, and nothing in the run is written."""
    loaded, notes = resumed_program(args.graph, graph_name, _overrides(args), args.config,
                                    run_dir, _say)
    refuse_untrained(loaded.plan, args.graph)
    checkpoint = resume_checkpoint(run_dir)
    for note in notes:  # said once the resume goes ahead: a refusal is one line
        _say(note)
    _before_launch(args, loaded)
    return loaded, checkpoint


def _locked_run(args, loaded, run_dir: RunDir, signals, record: dict) -> int:
    """`loaded`: a new run's program; a resume's graph name (its program is made here,
    under the lock, from the run's own config)."""
    from hybridflow.run.loop import Trainer  # imports torch: keep `check` fast
    checkpoint = None
    if args.resume:
        try:
            loaded, checkpoint = _resumed(args, loaded, run_dir)
        except user_errors() as err:
            return report("run", err)
    else:
        run_dir.save_graph_identity(graph_identity(loaded.graph.name, args.graph))
        run_dir.save_config(loaded.cfg)
        # what the commands reading a run directory need, as data (never its code)
        run_dir.save_json(PLAN_FILE, record)
        run_dir.set_status("starting", step=0, steps=loaded.cfg.trainer.steps)
    try:  # datasets are read, then the workers start (and a resume loads its checkpoint)
        trainer = Trainer(loaded, run_dir, resume_from=run_dir.path if args.resume else None,
                          checkpoint=checkpoint)
    except BaseException as err:  # noqa: BLE001 - torch's DCP raises one: recorded
        if raised_by_code(err, signals):
            err = contain(err, "user code")
        return _start_failed(run_dir, err, resumed=bool(args.resume))
    signals.reclaim()  # a Ray runtime's start replaced the SIGTERM handler
    for note in trainer.notes:  # rows dropped as too long; what a resume trimmed
        _say(note)
    if args.resume and not loaded.cfg.trainer.val_only:  # a look at it changes no config
        run_dir.save_config(loaded.cfg)
        run_dir.save_json(PLAN_FILE, plan_record(loaded.plan, loaded.cfg))
    if args.resume:
        _say(f"resumed from {trainer.resumed_from} (step {trainer.step})"
             if trainer.resumed_from else f"{run_dir.path} wrote no step and no checkpoint "
             f"yet: starting at step 0")
    echo(f"run directory: {run_dir.path}")
    progress = _Progress(loaded.cfg.trainer.steps, trainer.step, loaded.cfg.trainer.progress)
    try:
        final = trainer.fit(on_step=progress.update, signals=signals)
    except KeyboardInterrupt as err:
        progress.close()  # before the message, so the bar does not redraw under it
        if raised_by_code(err, signals):
            return _failed(run_dir, f"stopped at step {trainer.step}",
                           contain(err, "user code"), step=trainer.step)
        return _interrupted(run_dir, trainer, err, args.graph)
    except BaseException as err:  # noqa: BLE001 - recorded, then reported
        progress.close()
        if signals.pending is not None:  # the step failed because the signal hit workers too
            return _interrupted(run_dir, trainer, Interrupted(signals.pending), args.graph, err)
        return _failed(run_dir, f"stopped at step {trainer.step}", err, step=trainer.step)
    finally:
        progress.close()
        _shut_down(trainer)
    _print_summary(final)
    return 0


def _shut_down(trainer) -> None:
    """Stop the workers; a shutdown that fails is said, and never replaces how the run
    ended (already recorded)."""
    try:
        trainer.close()
    except Exception as err:  # noqa: BLE001 - the run's outcome stands
        _say(f"note: stopping the workers failed: {cause_line(err)}")


def _unrecorded(run_dir: RunDir, err: BaseException, signals) -> int:
    """The one net under a locked run: an exception that no path above recorded (a
    write to a full disk, a resume's own checks, anything new) still ends as one line,
    with its traceback in error.log and, when this process had marked the run as
    going (status.json `starting`/`running` with its pid), status.json final."""
    try:
        status = run_dir.status()
    except Exception:  # noqa: BLE001 - a damaged status.json is replaced below
        status = {"pid": os.getpid(), "state": "running"}
    ours = status.get("pid") == os.getpid() and status.get("state") in ("starting", "running")
    step = int(status.get("step") or 0)
    if isinstance(err, KeyboardInterrupt) and not raised_by_code(err, signals):
        name = getattr(err, "signal_name", "SIGINT")
        notes = record_end(run_dir, "interrupted", step, signal=name) if ours else []
        echo(f"\nhybridflow run: {name}: stopped at step {step}", file=sys.stderr)
        for note in notes:
            _say(note)
        return getattr(err, "exit_code", 130)
    err = contain(err, "user code") if isinstance(err, KeyboardInterrupt) else err
    if ours:
        return _failed(run_dir, f"stopped at step {step}", err, step=step)
    try:
        run_dir.log_error("".join(traceback.format_exception(err)))
    except OSError:
        pass
    echo(f"hybridflow run: {failure_reason(err)}\n(details: {run_dir.file('error.log')})",
         file=sys.stderr)
    return 1


def _start_failed(run_dir: RunDir, err: BaseException, resumed: bool) -> int:
    """A new run records the failure in status.json; a failed resume leaves the run's
    status as it was (the run did not change) and logs to error.log only."""
    if isinstance(err, KeyboardInterrupt):
        if not resumed:
            record_end(run_dir, "interrupted", 0, signal=getattr(err, "signal_name", "SIGINT"))
        echo(f"\nhybridflow run: interrupted during start-up "
             f"({getattr(err, 'signal_name', 'SIGINT')})", file=sys.stderr)
        return getattr(err, "exit_code", 130)
    if not resumed:
        return _failed(run_dir, "could not start", err, step=0)
    notes = []
    try:
        run_dir.log_error("".join(traceback.format_exception(err)))
    except OSError as write_err:
        notes.append(f"could not write {run_dir.file('error.log')}: {write_err.strerror}")
    echo(f"hybridflow run: could not resume: {failure_reason(err)}\n"
         f"(details: {run_dir.file('error.log')}; the run directory is unchanged)",
         file=sys.stderr)
    for note in notes:
        _say(note)
    return 1


def _interrupted(run_dir: RunDir, trainer, err: KeyboardInterrupt, graph: str,
                 cause: BaseException | None = None) -> int:
    name = getattr(err, "signal_name", "SIGINT")
    saved = getattr(err, "saved", None) or trainer.last_saved
    done = trainer.completed  # the last step that finished, not the one cut short
    notes = record_end(run_dir, "interrupted", done, cause, signal=name,
                       checkpoint=saved, steps=trainer.cfg.trainer.steps)
    where = f"checkpoint {saved}" if saved else "no checkpoint yet"
    at = f"step {done}" if done == trainer.step else \
        f"step {done}; step {trainer.step} did not finish"
    echo(f"\nhybridflow run: {name}: stopped at {at} ({where}); resume "
         f"with: hybridflow run {graph} --resume {run_dir.path}", file=sys.stderr)
    for note in notes:
        _say(note)
    return getattr(err, "exit_code", 130)


def _failed(run_dir: RunDir, what: str, err: BaseException, step: int) -> int:
    """Record why the run stopped (status.json, and the traceback in error.log) and
    print one line; a record the disk refuses is named, not raised."""
    reason = failure_reason(err)
    reason = reason.removeprefix(f"step {step}: ")  # NumericsError names the step itself
    notes = record_end(run_dir, "failed", step, err, reason=reason,
                       node=getattr(err, "node", None), rank=getattr(err, "rank", None),
                       error=type(err).__name__)
    echo(f"hybridflow run: {what}: {reason}\n(details: {run_dir.file('error.log')})",
         file=sys.stderr)
    for note in notes:
        _say(note)
    return 1


def progress_fields(metrics: dict) -> dict[str, float]:
    """What the bar shows after a step: `reward` (the first of OPTIMISED_REWARD_KEYS
    the step logged), the policy loss and the validation metrics."""
    shown = {}
    reward = next((metrics[k] for k in OPTIMISED_REWARD_KEYS if k in metrics), None)
    if reward is not None:
        shown["reward"] = reward
    if "actor/pg_loss" in metrics:
        shown["pg_loss"] = metrics["actor/pg_loss"]
    shown.update({k.split("/")[-2] if k.endswith("/mean") else k.split("/")[-1]: v
                  for k, v in metrics.items() if k.startswith("val/")})
    return {k: v for k, v in shown.items() if isinstance(v, float)}


class _Progress:
    """A progress bar with step, reward and time left; the watch of the step metrics
    (commands/run_watch.py) says its warning above it."""

    def __init__(self, total: int, start: int, enabled: bool):
        from tqdm import tqdm

        from hybridflow.commands.run_watch import ZeroSignalWatch
        self.bar = tqdm(total=total, initial=start, disable=not enabled, unit="step",
                        dynamic_ncols=True)
        self.bar.refresh()  # drawn before the first step's work (a stuck step shows 0/N)
        self.watch = ZeroSignalWatch(self._say)

    @staticmethod
    def _say(text: str) -> None:
        from tqdm import tqdm
        tqdm.write(printable(f"hybridflow run: {text}"), file=sys.stderr)  # above the bar

    def update(self, step: int, metrics: dict) -> None:
        self.watch.update(step, metrics)
        # metric names can hold a data row's data_source: shown through printable
        self.bar.set_postfix({printable(k): f"{v:.3f}"
                              for k, v in progress_fields(metrics).items()}, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _print_summary(metrics: dict) -> None:
    keys = [k for k in metrics if k.startswith("val/") or k in OPTIMISED_REWARD_KEYS]
    for key in sorted(keys):
        echo(f"{key}: {metrics[key]:.4f}")
