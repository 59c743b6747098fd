"""A measured run as planner input: its graph, models, workload and placement, and what each
node took.

Reads RUN_DIR/plan.json (the compiled graph as data: the graph file is never
imported), config.yaml (the merged config),
metrics.jsonl (mean response length, step time) and timeline.jsonl (start and
end of every node of every step). The first step warms up (imports, allocator,
lazy init) and is left out when the run has more; of the steps kept, each
node's median counts, so one stalled step (a busy machine) does not skew it.
An async run (`trainer.staleness >= 1`) carries its planner `Pipeline`, and its
rollout role when the run placed it on a pool of its own. Keeps no state: one read
gives a frozen `MeasuredRun`.
"""
from __future__ import annotations

import math
import os
import statistics
from hybridflow.planner.measured import MeasuredRun
from hybridflow.core.metric_names import STEP_TIME
from hybridflow.core.modes import run_modes
from hybridflow.planner.problem import PlanningError, Workload

WARMUP_STEPS = 1

__all__ = ["MeasuredRun", "WARMUP_STEPS", "read_run", "node_means", "run_workload",
           "run_pools"]


def _jsonl(path: str) -> list[dict]:
    from hybridflow.core.loading import read_jsonl
    if not os.path.lexists(path):
        raise PlanningError(f"{path} does not exist: is this a run directory of "
                            "`hybridflow run` (it writes timeline.jsonl and metrics.jsonl)?")
    return [record for _, record in read_jsonl(path, "run record")]


def _timeline(path: str) -> list[dict]:
    """timeline.jsonl's records: each with a step, a node and start/end seconds."""
    from hybridflow.core.loading import UserFileError
    records = _jsonl(path)
    for number, record in enumerate(records, 1):
        if not (isinstance(record.get("step"), int) and isinstance(record.get("node"), str)
                and all(isinstance(record.get(k), (int, float)) for k in ("start", "end"))):
            raise UserFileError(f"run record {path!r}: record {number} lacks a step, node, "
                                f"start or end of the right type ({str(record)[:80]})", path)
    if not records:
        raise PlanningError(f"{path} holds no node timings: calibrate from a run that "
                            f"finished at least one step")
    return records


def read_run(run_dir: str) -> MeasuredRun:
    """The measured run in `run_dir`, from its records only (config.yaml, plan.json,
    metrics.jsonl, timeline.jsonl): the graph file is never imported."""
    from hybridflow.core.loading import check_dir
    from hybridflow.program.auto_placement import run_models
    from hybridflow.program.run_record import read_plan_record, read_run_config

    check_dir(run_dir, "run directory", "give a directory made by `hybridflow run`")
    graph_json = os.path.join(run_dir, "graph.json")
    if not os.path.lexists(graph_json):
        raise PlanningError(f"{graph_json} does not exist: is {run_dir} a run directory of "
                            "`hybridflow run`?")
    cfg = read_run_config(run_dir)
    recorded = read_plan_record(run_dir)
    pipeline = recorded.pipeline()
    timeline = _timeline(os.path.join(run_dir, "timeline.jsonl"))
    metrics = _jsonl(os.path.join(run_dir, "metrics.jsonl"))
    if not metrics:
        raise PlanningError(f"{os.path.join(run_dir, 'metrics.jsonl')} holds no step "
                            f"metrics: calibrate from a run that finished at least one step")
    steps = sorted({r["step"] for r in timeline})
    kept = tuple(steps[WARMUP_STEPS:] if len(steps) > WARMUP_STEPS else steps)
    models = run_models(cfg, recorded)
    return MeasuredRun(run_dir, recorded, models, run_workload(cfg, metrics, kept),
                       *run_pools(cfg, list(recorded.record["roles"])),
                       node_means(timeline, kept),
                       _median([m[STEP_TIME] for m in metrics if m.get("step") in kept
                                and STEP_TIME in m]), kept, pipeline)


def node_means(timeline: list[dict], steps: tuple[int, ...]) -> dict[str, float]:
    """Median seconds per node over `steps`. A node a step runs twice counts its sum; a node
    with one record per rank (Ray) counts its slowest rank."""
    per_rank: dict[tuple[str, int, object], float] = {}
    for record in timeline:
        if record["step"] in steps:
            key = (record["node"], record["step"], record.get("rank"))
            per_rank[key] = per_rank.get(key, 0.0) + record["end"] - record["start"]
    per_step: dict[str, dict[int, float]] = {}
    for (node, step, _), seconds in per_rank.items():
        by_step = per_step.setdefault(node, {})
        by_step[step] = max(by_step.get(step, 0.0), seconds)
    return {node: statistics.median(v.values()) for node, v in per_step.items()}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def run_workload(cfg, metrics: list[dict], steps: tuple[int, ...]) -> Workload:
    """One step's work as the run's config and measured response lengths say."""
    sequences = cfg.data.batch_size * cfg.rollout.n
    prompt, response = cfg.data.max_prompt_length, cfg.rollout.max_new_tokens
    lengths = [m["response_length/mean"] for m in metrics
               if m.get("step") in steps and "response_length/mean" in m]
    mean = min(float(response), _mean(lengths)) if lengths else 0.0
    padded = prompt + response  # the torch workers pad every row to the batch's longest
    return Workload(prompts=cfg.data.batch_size, samples_per_prompt=cfg.rollout.n,
                    prompt_len=prompt, response_len=response, ppo_epochs=cfg.actor.ppo_epochs,
                    mini_batches=max(1, math.ceil(sequences / cfg.actor.mini_batch_size)),
                    micro_batch_tokens=cfg.actor.micro_batch_size * padded,
                    response_mean=mean, padded_len=padded)



def run_pools(cfg, roles: list[str]) -> tuple[int, tuple[tuple[str, ...], ...]]:
    """(devices, colocation) of the run: the local runtime runs every role in one process."""
    if not run_modes(cfg).runtime.process_per_rank:
        return 1, (tuple(roles),)
    pools = dict(cfg.placement.pools)
    first = next(iter(pools))
    groups: dict[str, list[str]] = {name: [] for name in pools}
    for role in roles:
        groups[cfg.placement.roles.get(role, first)].append(role)
    devices = sum(p.nodes * p.devices_per_node for name, p in pools.items() if groups[name])
    return devices, tuple(tuple(g) for g in groups.values() if g)
