"""`hybridflow run graph.py [key=value ...] [--config f.yaml] [--runtime local|ray]
[--address ADDR] [--resume [RUN_DIR]]`: train, writing everything to a run directory."""
from __future__ import annotations

import argparse
import os
import sys
import traceback

from hybridflow.program import GraphFileError, prepare
from hybridflow.compiler import GraphError
from hybridflow.config import ConfigError
from hybridflow.data import DataError
from hybridflow.tracking import RunDir, new_run_dir, newest_run_dir

__all__ = ["add_parser", "run"]
_NEWEST = "__newest__"


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("run", help="train with a graph file")
    parser.add_argument("graph", help="a graph file exporting build(cfg), e.g. graphs/grpo.py")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.add_argument("-c", "--config", help="YAML config file, merged before overrides")
    parser.add_argument("--runtime", choices=("local", "ray"), help="default: runtime.name")
    parser.add_argument("--address", help="join this Ray cluster (implies --runtime ray)")
    parser.add_argument("--resume", nargs="?", const=_NEWEST, metavar="RUN_DIR",
                        help="continue a run from its last checkpoint (default: the newest "
                             "run of this graph)")
    return parser


def _overrides(args) -> list[str]:
    extra = list(args.overrides)
    if args.address and args.runtime == "local":
        raise ConfigError(f"--runtime local and --address {args.address} contradict each "
                          f"other: --address joins a Ray cluster; drop one of them")
    if args.runtime:
        extra.append(f"runtime.name={args.runtime}")
    if args.address:
        extra += ["runtime.name=ray", f"runtime.address={args.address}"]
    return extra


def _run_dir(args, loaded) -> RunDir:
    trainer = loaded.cfg.trainer
    if args.resume == _NEWEST and trainer.run_name:  # the run of that name
        path = os.path.join(trainer.runs_dir, trainer.run_name)
        if not os.path.isfile(os.path.join(path, "config.yaml")):
            raise FileNotFoundError(f"--resume: no run named {trainer.run_name!r} in "
                                    f"{trainer.runs_dir!r}")
        return RunDir(path)
    if args.resume == _NEWEST:
        return newest_run_dir(trainer.runs_dir, loaded.graph.name)
    if args.resume:
        if not os.path.isfile(os.path.join(args.resume, "config.yaml")):
            raise FileNotFoundError(f"--resume {args.resume}: not a run directory "
                                    f"(no config.yaml)")
        return RunDir(args.resume)
    return new_run_dir(trainer.runs_dir, loaded.graph.name, trainer.run_name)


def run(args) -> int:
    from hybridflow.loop import Trainer  # imports torch: keep `check` fast
    try:  # everything that can be checked before a worker starts
        loaded = prepare(args.graph, _overrides(args), args.config)
        run_dir = _run_dir(args, loaded)
        if args.resume:  # a resumed run keeps its own config
            loaded = prepare(args.graph, [*_overrides(args)],
                             run_dir.file("config.yaml") if not args.config else args.config)
    except (GraphError, ConfigError, GraphFileError, DataError, FileNotFoundError) as err:
        print(f"hybridflow run: {err}", file=sys.stderr)
        return 1
    run_dir.save_config(loaded.cfg)
    try:  # datasets are read, then the workers start
        trainer = Trainer(loaded, run_dir, resume_from=run_dir.path if args.resume else None)
    except Exception as err:  # noqa: BLE001 - recorded, then reported
        return _failed(run_dir, "could not start", err, step=0)
    print(f"run directory: {run_dir.path}")
    progress = _Progress(loaded.cfg.trainer.steps, trainer.step, loaded.cfg.trainer.progress)
    try:
        final = trainer.fit(on_step=progress.update)
    except KeyboardInterrupt:
        run_dir.set_status("interrupted", step=trainer.step)
        print("\ninterrupted; resume with --resume " + run_dir.path, file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - recorded, then reported
        return _failed(run_dir, f"stopped at step {trainer.step}", err, step=trainer.step)
    finally:
        progress.close()
        trainer.close()
    _print_summary(final)
    return 0


def failure_reason(err: BaseException) -> str:
    """One line a user can act on: a node failure's summary, or the error's first line."""
    summary = getattr(err, "summary", None)
    if summary:
        return summary
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else ""
    ours = type(err).__module__.split(".")[0] in ("hybridflow", "algorithms")
    known = ours or isinstance(err, (FileNotFoundError, ValueError))
    return text if known and text else f"{type(err).__name__}: {text}".rstrip(": ")


def _failed(run_dir: RunDir, what: str, err: BaseException, step: int) -> int:
    """Record why the run stopped in status.json (with the traceback) and print one line."""
    reason = failure_reason(err)
    reason = reason.removeprefix(f"step {step}: ")  # NumericsError names the step itself
    run_dir.set_status("failed", step=step, reason=reason, node=getattr(err, "node", None),
                       rank=getattr(err, "rank", None), error=type(err).__name__,
                       traceback=traceback.format_exc())
    print(f"hybridflow run: {what}: {reason}\n(details: {run_dir.file('status.json')})",
          file=sys.stderr)
    return 1


class _Progress:
    """A progress bar with step, reward and time left."""

    def __init__(self, total: int, start: int, enabled: bool):
        from tqdm import tqdm
        self.bar = tqdm(total=total, initial=start, disable=not enabled, unit="step",
                        dynamic_ncols=True)

    def update(self, step: int, metrics: dict) -> None:
        shown = {k.split("/")[-2] if k.endswith("/mean") else k.split("/")[-1]: v
                 for k, v in metrics.items()
                 if k in ("critic/score/mean", "actor/pg_loss") or k.startswith("val/")}
        self.bar.set_postfix({k: f"{v:.3f}" for k, v in shown.items()
                              if isinstance(v, float)}, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _print_summary(metrics: dict) -> None:
    keys = [k for k in metrics if k.startswith("val/") or k == "critic/score/mean"]
    for key in sorted(keys):
        print(f"{key}: {metrics[key]:.4f}")
