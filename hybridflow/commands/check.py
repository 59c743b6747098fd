"""`hybridflow check graph.py [key=value ...]`: compile only; no Ray, no model weights.
`--memory` adds each role's and pool's predicted peak memory (hybridflow/memory/,
imported only then: models are built on the meta device, no weights allocated)."""
from __future__ import annotations

import argparse
import sys

from hybridflow.program.assemble import GraphFileError, compile_program, prepare
from hybridflow.program.validation import compile_validation, validation_runs
from hybridflow.plan.compiler import GraphError
from hybridflow.program.config import ConfigError
from hybridflow.program.provenance import provenance_lines
from hybridflow.core.printable import echo
from hybridflow.core.data import DataError
from hybridflow.core.loading import UserFileError
from hybridflow.commands.args import add_run_arguments, resume_word, run_overrides
from hybridflow.program.run_record import plan_record

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("check", help="validate a graph file; starts no workers")
    add_run_arguments(parser)  # `run`'s arguments: the command line `run` would take
    parser.add_argument("--print-config", action="store_true",
                        help="also print the merged configuration as YAML")
    parser.add_argument("--memory", action="store_true",
                        help="also predict each role's peak memory per device and check "
                             "that every pool fits (exit 1 if not)")
    return parser


def run(args) -> int:
    resume_word(args)
    resumed: list[str] = []
    try:
        if args.resume:  # what `run --resume` checks before a worker starts, read only
            loaded, resumed = _resumed_program(args)
        else:
            loaded = prepare(args.graph, run_overrides(args), args.config)
        if validation_runs(loaded.cfg):  # the loop's contract with the validation graph
            compile_validation(loaded.module, loaded.cfg, compile_program)
        plan_record(loaded.plan, loaded.cfg)  # what `run` reads before launch (model shapes)
    except (GraphError, ConfigError, GraphFileError, DataError, UserFileError,
            FileNotFoundError) as err:
        echo(f"hybridflow check: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - a resume's refusals (ResumeError, ...)
        from hybridflow.commands.errors import report
        return report("check", err)  # one line for a user error; a bug re-raises
    if args.print_config:
        from omegaconf import OmegaConf
        echo(OmegaConf.to_yaml(loaded.cfg))
    echo(loaded.plan.summary())
    echo("\n".join(provenance_lines(loaded.cfg, loaded.plan)))
    for note in resumed + _not_checked(args, loaded):
        echo(f"note: {note}")
    if args.memory:
        from hybridflow.memory.report import format_report, plan_memory
        report = plan_memory(loaded.cfg, loaded.plan)
        echo(format_report(report))
        if not report.fits:
            for line in report.problems():
                echo(f"hybridflow check: {line}", file=sys.stderr)
            return 1
    echo("ok")
    return 0


def _resumed_program(args):
    """`run --resume`'s program, made as `run` makes it before a worker starts (the run
    found, its own config plus this command line through every check, the graph's
    training node, the newest checkpoint verified), writing nothing: (program, notes)."""
    from hybridflow.commands.args import NEWEST
    from hybridflow.commands.resume import graph_and_trainer, resume_dir, resumed_program
    from hybridflow.commands.run import refuse_untrained
    from hybridflow.run.lifecycle import resume_checkpoint
    overrides = run_overrides(args)
    name, trainer = graph_and_trainer(args.graph, overrides, args.config)
    run_dir = resume_dir(args.resume, args.resume == NEWEST, name, trainer)
    said: list[str] = []
    loaded, changes = resumed_program(args.graph, name, overrides, args.config, run_dir,
                                      said.append)
    refuse_untrained(loaded.plan, args.graph)
    checkpoint = resume_checkpoint(run_dir)
    where = (f"--resume: {run_dir.path} resumes from {checkpoint}" if checkpoint else
             f"--resume: {run_dir.path} wrote no step and no checkpoint yet: it starts at "
             f"step 0")
    return loaded, [*said, *changes, where]


def _not_checked(args, loaded) -> list[str]:
    """What `run` would also check that needs more than this process: said, not skipped
    silently."""
    notes = []
    if args.resume:
        notes.append("--resume: the checkpoint's files were verified against its manifest; "
                     "its tensors are loaded by the workers")
    if args.address:
        notes.append(f"--address {args.address}: the cluster is not contacted by `check`")
    if not args.memory and loaded.cfg.trainer.check_memory:
        notes.append("memory not predicted (add --memory: `run` refuses a CPU run whose "
                     "prediction does not fit this machine)")
    return notes
