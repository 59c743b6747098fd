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

__all__ = ["add_parser", "run"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("check", help="validate a graph file; starts no workers")
    parser.add_argument("graph", help="a graph file exporting build(cfg)")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    parser.add_argument("-c", "--config", help="YAML config file, merged before overrides")
    parser.add_argument("--print-config", action="store_true",
                        help="also print the merged configuration as YAML")
    parser.add_argument("--memory", action="store_true",
                        help="also predict each role's peak memory per device and check "
                             "that every pool fits (exit 1 if not)")
    return parser


def run(args) -> int:
    try:
        loaded = prepare(args.graph, args.overrides, args.config)
        if validation_runs(loaded.cfg):  # the loop's contract with the validation graph
            compile_validation(loaded.module, loaded.cfg, compile_program)
    except (GraphError, ConfigError, GraphFileError) as err:
        echo(f"hybridflow check: {err}", file=sys.stderr)
        return 1
    if args.print_config:
        from omegaconf import OmegaConf
        echo(OmegaConf.to_yaml(loaded.cfg))
    echo(loaded.plan.summary())
    echo("\n".join(provenance_lines(loaded.cfg, loaded.plan)))
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
