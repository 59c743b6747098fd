"""`hybridflow render`: draw a graph (and its placement), or recorded steps' timeline.

    hybridflow render graphs/ppo.py -o ppo.svg [--plan] [key=value ...]
    hybridflow render --timeline RUN_DIR -o timeline.svg [--step N | --steps A-B]

The timeline of an async run (`trainer.staleness >= 1` in RUN_DIR/config.yaml) marks
its rollout-side nodes, read from RUN_DIR/plan.json (written when the run started):
a run directory is data, and its graph file is never imported. A run without
plan.json is drawn without them, and a note says why. A streaming run
(`trainer.async_mode=streaming`) is drawn on one continuous time axis, no step lines.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from hybridflow.commands.args import count
from hybridflow.core.modes import AsyncMode
from hybridflow.core.printable import echo

__all__ = ["add_parser", "run", "read_timeline", "parse_steps", "timeline_sides"]


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "render", help="draw a graph, its placement (--plan), or a run's timeline",
        description="Draw a graph file as .svg/.png/.pdf (needs Graphviz's `dot`) or .dot; "
                    "with --timeline, draw one recorded step of a run as an SVG Gantt chart.")
    parser.add_argument("graph", nargs="?", help="graph file exporting build(cfg)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides, e.g. rollout.n=4")
    parser.add_argument("-o", "--output", required=True,
                        help="output file; the extension picks the format")
    parser.add_argument("--plan", action="store_true",
                        help="add resource pools and colocated roles")
    parser.add_argument("-c", "--config", help="YAML config file, merged before overrides")
    parser.add_argument("--timeline", metavar="RUN_DIR",
                        help="draw RUN_DIR/timeline.jsonl instead of a graph")
    steps = parser.add_mutually_exclusive_group()
    steps.add_argument("--step", type=count(0, 10**9, "a recorded step"),
                       help="timeline step (default: the last recorded)")
    steps.add_argument("--steps", metavar="A-B",
                       help="timeline steps A to B laid end to end (e.g. 3-5), to see "
                            "an async run pipeline across steps; a streaming run's on one "
                            "continuous time axis")
    parser.set_defaults(run=run)
    return parser


def read_timeline(run_dir: str) -> list[dict]:
    """The records of RUN_DIR/timeline.jsonl (or of a .jsonl file named directly)."""
    from hybridflow.core.loading import UserFileError, read_jsonl
    path = Path(run_dir)
    path = path if path.suffix == ".jsonl" else path / "timeline.jsonl"
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path} does not exist: pass the run directory of a "
                                "`hybridflow run` (it writes timeline.jsonl)")
    records = []
    for number, record in read_jsonl(str(path), "run timeline"):
        if not (isinstance(record.get("node"), str) and isinstance(record.get("step"), int)
                and all(isinstance(record.get(k), (int, float)) for k in ("start", "end"))):
            raise UserFileError(f"run timeline {str(path)!r} line {number}: a record needs a "
                                f"node, a step and start/end seconds ({str(record)[:80]})",
                                str(path))
        records.append(record)
    if not records:
        raise UserFileError(f"run timeline {str(path)!r} holds no records: the run did not "
                            f"finish a step", str(path))
    return records


def parse_steps(text: str | None) -> tuple[int, int] | None:
    """'3-5' -> (3, 5); '4' -> (4, 4); ValueError naming the option otherwise."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not match or int(match[2] or match[1]) < int(match[1]):
        raise ValueError(f"--steps {text!r}: give a range of steps like 3-5 (first <= last)")
    return int(match[1]), int(match[2] or match[1])


def timeline_sides(run_dir: str):
    """(the async sides of the run in `run_dir` for the chart, or None when it ran
    synchronously or has no config.yaml; a note when an async run's sides could not
    be read, or None). Read from RUN_DIR/plan.json: the graph file is never imported."""
    from omegaconf import OmegaConf

    from hybridflow.draw.timeline import TimelineSides
    from hybridflow.program.run_record import PLAN_FILE, read_plan_record, read_run_config
    path = Path(run_dir)
    path = path.parent if path.suffix == ".jsonl" else path
    config = path / "config.yaml"
    if not os.path.lexists(config):  # a timeline alone: nothing says it ran async
        return None, None
    cfg = read_run_config(str(path))
    if int(OmegaConf.select(cfg, "trainer.staleness", default=0) or 0) < 1:
        return None, None
    if not os.path.lexists(path / PLAN_FILE):
        return None, (f"note: the rollout side of {path} is not marked: it has no "
                      f"{PLAN_FILE} (a run made before it was written)")
    sides = read_plan_record(str(path)).record.get("sides")
    if not sides:
        return None, None
    streaming = AsyncMode.of(OmegaConf.select(cfg, "trainer.async_mode",
                                              default=AsyncMode.PIPELINE)).streams
    return TimelineSides(frozenset(sides["rollout"]), int(sides["staleness"]), sides["source"],
                         int(cfg.trainer.steps), streaming), None


def _render_timeline(args: argparse.Namespace):
    from hybridflow.draw.graph import render_timeline
    records = read_timeline(args.timeline)
    sides, note = timeline_sides(args.timeline)
    if note:
        echo(note, file=sys.stderr)
    return render_timeline(records, args.output, args.step, sides, parse_steps(args.steps))


def run(args: argparse.Namespace) -> int:
    from hybridflow.plan.compiler import GraphError
    from hybridflow.program.config import ConfigError
    from hybridflow.draw.graph import RenderError, render_graph

    from hybridflow.core.files import check_output
    # the inputs are files: a drawing may go into the run directory it draws
    check_output(args.output, "-o", "file", inputs=[args.graph, args.config])
    try:
        if args.timeline:
            if args.graph:
                raise RenderError("give either a graph file or --timeline RUN_DIR, not both")
            out = _render_timeline(args)
        elif args.graph:
            from hybridflow.program import assemble as program
            extra = {"yaml_file": args.config} if args.config else {}
            loaded = program.prepare(args.graph, list(args.overrides), preflight=False, **extra)
            out = render_graph(loaded.plan, args.output, show_plan=args.plan)
            if args.plan:  # what the drawing cannot hold: where weights and state come from
                from hybridflow.program.provenance import provenance_lines
                echo("\n".join(provenance_lines(loaded.cfg, loaded.plan)))
        else:
            raise RenderError("nothing to draw: give a graph file (hybridflow render "
                              "graph.py -o out.svg) or --timeline RUN_DIR")
    except (GraphError, ConfigError, RenderError, FileNotFoundError, ValueError) as err:
        echo(f"hybridflow render: {err}", file=sys.stderr)
        return 1
    echo(f"wrote {out}")
    return 0
