"""Run directories as `hybridflow run` records them (config.yaml in full, graph.json,
plan.json), written by compiling a graph file here in the test: the commands that
read a run directory never compile or import it themselves."""
from __future__ import annotations

import json
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def record_run(folder, graph: str, yaml_text: str = "", graph_file: str | None = None) -> str:
    """Write folder/config.yaml (the merged config), graph.json (naming `graph_file`,
    default `graph`) and plan.json for `graph` compiled with `yaml_text`."""
    from hybridflow.program.assemble import prepare
    from hybridflow.program.run_record import save_plan_record
    from hybridflow.run.tracking import RunDir
    os.makedirs(folder, exist_ok=True)
    source = os.path.join(str(folder), "source.yaml")
    with open(source, "w") as handle:
        handle.write(yaml_text or "{}\n")
    loaded = prepare(graph, [], source, preflight=False)
    os.remove(source)
    run = RunDir(str(folder), create=False)
    run.save_config(loaded.cfg)
    run.save_graph_identity({"name": loaded.graph.name, "file": graph_file or graph,
                             "sha256": "-"})
    save_plan_record(run, loaded.plan, loaded.cfg)
    return str(folder)


def graph_path(name: str) -> str:
    return os.path.join(REPO, "graphs", name)


def write_jsonl(path, records) -> None:
    with open(path, "w") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in records))
