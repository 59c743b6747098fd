"""`hybridflow render`: draw a graph (and its placement), or a recorded step's timeline.

    hybridflow render graphs/ppo.py -o ppo.svg [--plan] [key=value ...]
    hybridflow render --timeline RUN_DIR -o timeline.svg [--step N]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["add_parser", "run", "read_timeline"]


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
    parser.add_argument("--step", type=int, help="timeline step (default: the last recorded)")
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


def run(args: argparse.Namespace) -> int:
    from hybridflow.compiler import GraphError
    from hybridflow.config import ConfigError
    from hybridflow.render import RenderError, render_graph, render_timeline

    try:
        if args.timeline:
            if args.graph:
                raise RenderError("give either a graph file or --timeline RUN_DIR, not both")
            out = render_timeline(read_timeline(args.timeline), args.output, args.step)
        elif args.graph:
            from hybridflow import program
            extra = {"yaml_file": args.config} if args.config else {}
            loaded = program.prepare(args.graph, list(args.overrides), preflight=False, **extra)
            out = render_graph(loaded.plan, args.output, show_plan=args.plan)
            if args.plan:  # what the drawing cannot hold: where weights and state come from
                from hybridflow.provenance import provenance_lines
                print("\n".join(provenance_lines(loaded.cfg, loaded.plan)))
        else:
            raise RenderError("nothing to draw: give a graph file (hybridflow render "
                              "graph.py -o out.svg) or --timeline RUN_DIR")
    except (GraphError, ConfigError, RenderError, FileNotFoundError, ValueError) as err:
        print(f"hybridflow render: {err}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0
