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
    from hybridflow.program.run_record import PLAN_FILE, plan_record
    from hybridflow.run.tracking import RunDir
    os.makedirs(folder, exist_ok=True)
    source = os.path.join(str(folder), "source.yaml")
    with open(source, "w") as handle:
        handle.write(yaml_text or "{}\n")
    loaded = prepare(graph, [], source, preflight=False)
    os.remove(source)
    run = RunDir(str(folder), create=False)
    run.save_config(loaded.cfg)
    from hybridflow.run.lifecycle import graph_identity
    identity = graph_identity(loaded.graph.name, graph)
    run.save_graph_identity({**identity, "file": graph_file or identity["file"]})
    run.save_json(PLAN_FILE, plan_record(loaded.plan, loaded.cfg))
    return str(folder)


def graph_path(name: str) -> str:
    return os.path.join(REPO, "graphs", name)


def write_jsonl(path, records) -> None:
    with open(path, "w") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in records))


GRPO_NODES = ("prompts", "rollout.generate", "actor.logprob", "reward.score",
              "grpo_advantages", "ref.logprob", "actor.update")


def fabricate_run(folder, graph: str | None = None,
                  yaml_text: str = "trainer: {steps: 3, val_every: 0}\n") -> str:
    """A finished 3-step run of graphs/grpo.py as `hybridflow run` leaves it: its
    records, node timings, metrics, status and one checkpoint (the toy model's files
    as the actor's, a trainer state, a manifest), without training anything."""
    import shutil

    import torch
    from safetensors.torch import save_file

    record_run(folder, graph or graph_path("grpo.py"), yaml_text)
    timeline, metrics = [], []
    for step in (1, 2, 3):
        clock = 0.0
        for node in GRPO_NODES:
            timeline.append({"step": step, "node": node, "start": clock, "end": clock + 0.1})
            clock += 0.1
        metrics.append({"step": step, "response_length/mean": 3.0,
                        "perf/time_per_step": clock})
    write_jsonl(os.path.join(folder, "timeline.jsonl"), timeline)
    write_jsonl(os.path.join(folder, "metrics.jsonl"), metrics)
    with open(os.path.join(folder, "status.json"), "w") as handle:
        json.dump({"state": "finished", "time": 0.0, "pid": 1, "host": "h", "step": 3,
                   "steps": 3}, handle)
    ckpt = os.path.join(folder, "checkpoints", "step_000003")
    shutil.copytree(os.path.join(REPO, "graphs", "assets", "toy_base"),
                    os.path.join(ckpt, "actor"))
    with open(os.path.join(ckpt, "trainer_state.json"), "w") as handle:
        json.dump({"step": 3}, handle)
    save_file({"state": torch.get_rng_state()}, os.path.join(ckpt, "rng_torch.safetensors"))
    remanifest(ckpt)
    return str(folder)


def remanifest(ckpt: str) -> None:
    """Write the checkpoint's manifest for the files it holds now (so a damaged file
    passes the size and sha256 check and reaches its reader)."""
    path = os.path.join(ckpt, "manifest.json")
    if os.path.lexists(path):
        os.remove(path)
    record = _manifest_of_regular_files(ckpt)
    with open(path, "w") as handle:
        json.dump(record, handle)


def _manifest_of_regular_files(ckpt: str) -> dict:
    """The manifest `save_checkpoint` writes, over the regular files only (a FIFO put
    in a file's place would block the sha256)."""
    from hybridflow.run.checkpoint import file_sha256
    files, sha256 = {}, {}
    for root, _, names in os.walk(ckpt):
        for name in names:
            full = os.path.join(root, name)
            if os.path.isfile(full):
                rel = os.path.relpath(full, ckpt)
                files[rel], sha256[rel] = os.path.getsize(full), file_sha256(full)
    return {"step": 3, "time": 0.0, "files": files, "sha256": sha256}
