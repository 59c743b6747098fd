"""`hybridflow render`: draw a graph (and its placement), or recorded steps' timeline.

    hybridflow render graphs/ppo.py -o ppo.svg [--plan] [key=value ...]
    hybridflow render --timeline RUN_DIR -o timeline.svg [--step N | --steps A-B]

The timeline of an async run (`trainer.staleness >= 1` in RUN_DIR/config.yaml) marks
its rollout-side nodes: their names come from compiling the run's graph file (named
in RUN_DIR/graph.json) with its saved config; when that fails the chart is drawn
without them, and a note says why.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

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
    steps.add_argument("--step", type=int, help="timeline step (default: the last recorded)")
    steps.add_argument("--steps", metavar="A-B",
                       help="timeline steps A to B laid end to end (e.g. 3-5), to see "
                            "an async run pipeline across steps")
    parser.set_defaults(run=run)
    return parser


def read_timeline(run_dir: str) -> list[dict]:
    """The records of RUN_DIR/timeline.jsonl (or of a .jsonl file named directly)."""
    path = Path(run_dir)
    path = path if path.suffix == ".jsonl" else path / "timeline.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: pass the run directory of a "
                                "`hybridflow run` (it writes timeline.jsonl)")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number} is not a JSON record: {err}") from None
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
    be read, or None)."""
    from omegaconf import OmegaConf

    from hybridflow.core.kinds import Op
    from hybridflow.draw.timeline import TimelineSides
    path = Path(run_dir)
    path = path.parent if path.suffix == ".jsonl" else path
    config = path / "config.yaml"
    if not config.is_file():  # a timeline alone: nothing says it ran async
        return None, None
    try:
        cfg = OmegaConf.load(config)
        if int(OmegaConf.select(cfg, "trainer.staleness", default=0) or 0) < 1:
            return None, None
        from hybridflow.program import assemble as program
        graph_file = json.loads((path / "graph.json").read_text())["file"]
        plan = program.prepare(graph_file, [], yaml_file=str(config), preflight=False).plan
    except Exception as err:  # noqa: BLE001 - the chart is still drawn, without sides
        return None, (f"note: the rollout side of {path} is not marked: its graph could "
                      f"not be compiled again ({type(err).__name__}: {err})")
    from hybridflow.plan.async_split import sides_of
    sides = sides_of(plan)
    rollout = [plan.node(n) for n in sides.rollout]
    sources = [n.name for n in rollout if n.op is Op.SOURCE]
    # a gather's rounds draw and record the source again: calls cannot be counted
    gathers = any(n.op is Op.GATHER for n in rollout)
    source = sources[0] if sources and not gathers else None
    return TimelineSides(frozenset(sides.rollout), sides.staleness, source,
                         int(cfg.trainer.steps)), None


def _render_timeline(args: argparse.Namespace):
    from hybridflow.draw.graph import render_timeline
    records = read_timeline(args.timeline)
    sides, note = timeline_sides(args.timeline)
    if note:
        print(note, file=sys.stderr)
    return render_timeline(records, args.output, args.step, sides, parse_steps(args.steps))


def run(args: argparse.Namespace) -> int:
    from hybridflow.plan.compiler import GraphError
    from hybridflow.program.config import ConfigError
    from hybridflow.draw.graph import RenderError, render_graph

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
                print("\n".join(provenance_lines(loaded.cfg, loaded.plan)))
        else:
            raise RenderError("nothing to draw: give a graph file (hybridflow render "
                              "graph.py -o out.svg) or --timeline RUN_DIR")
    except (GraphError, ConfigError, RenderError, FileNotFoundError, ValueError) as err:
        print(f"hybridflow render: {err}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0
