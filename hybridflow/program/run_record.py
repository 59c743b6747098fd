"""What the commands that read a run directory need of its compiled graph, written as
data (RUN_DIR/plan.json) when the run starts.

A run directory is data, never code: `render --timeline`, `plan --calibrate`,
`status` and `export` read plan.json and config.yaml and never import the graph file
that graph.json names (opening someone else's run directory must not run their
code). plan.json holds the planner's view of the graph (each node's name, kind, role
and deps), the async pipeline, the roles the run placed, and the timeline's rollout
side. Stateless.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from hybridflow.core.loading import UserFileError, read_json

__all__ = ["PLAN_FILE", "run_roles", "plan_record", "read_plan_record", "RecordedPlan",
           "read_run_config"]

PLAN_FILE = "plan.json"
_FORMAT = 1


def plan_record(plan, cfg) -> dict:
    """The record of a compiled `plan` (synchronous or async) and its config."""
    from hybridflow.core.kinds import Op
    from hybridflow.plan.async_split import sides_of
    from hybridflow.program.async_planning import pipeline_view
    from hybridflow.program.auto_placement import run_models

    view, pipeline = pipeline_view(plan)
    models = run_models(cfg, view)
    sides, split = None, sides_of(plan)
    if split is not None:
        rollout = [plan.node(n) for n in split.rollout]
        sources = [n.name for n in rollout if n.op is Op.SOURCE]
        # a gather's rounds draw and record the source again: calls cannot be counted
        gathers = any(n.op is Op.GATHER for n in rollout)
        sides = {"rollout": list(split.rollout), "staleness": split.staleness,
                 "source": sources[0] if sources and not gathers else None}
    return {
        "format": _FORMAT, "graph": plan.graph_name,
        "nodes": [{"name": n.name, "kind": str(n.kind), "role": n.role, "deps": list(n.deps)}
                  for n in view.nodes],
        "pipeline": None if pipeline is None else {
            "staleness": pipeline.staleness, "rollout_side": sorted(pipeline.rollout_side),
            "movable": dict(pipeline.movable), "streaming": pipeline.streaming},
        "model_roles": list(models), "roles": run_roles(plan, pipeline, models),
        "sides": sides}


@dataclass(frozen=True)
class RecordedPlan:
    """A run's graph as the planner reads it (`.nodes`, `.roles`), from plan.json."""
    graph_name: str
    nodes: tuple
    record: dict

    @property
    def roles(self) -> list[str]:
        return sorted({n.role for n in self.nodes if n.role})

    def pipeline(self):
        from hybridflow.planner import Pipeline
        found = self.record.get("pipeline")
        if not found:
            return None
        return Pipeline(int(found["staleness"]), frozenset(found["rollout_side"]),
                        dict(found["movable"]), bool(found.get("streaming", False)))


def read_plan_record(run_dir: str) -> RecordedPlan:
    """RUN_DIR/plan.json as a RecordedPlan; UserFileError naming the file when it is
    missing (a run made before plan.json was written), damaged or of another shape."""
    from hybridflow.planner.problem import NodeInfo
    path = os.path.join(run_dir, PLAN_FILE)
    fix = ("it is written when `hybridflow run` starts (runs made before plan.json "
           "existed lack it: run the graph again)")
    record = read_json(path, "run plan record", dict, fix)
    try:
        nodes = tuple(NodeInfo(str(n["name"]), str(n["kind"]), n["role"], tuple(n["deps"]))
                      for n in record["nodes"])
        for key in ("model_roles", "roles"):
            if not isinstance(record[key], list):
                raise TypeError(f"{key} is not a list")
        return RecordedPlan(str(record["graph"]), nodes, record)
    except (KeyError, TypeError, ValueError) as err:
        raise UserFileError(f"run plan record {path!r} is not what `hybridflow run` writes "
                            f"({type(err).__name__}: {err}); {fix}", path) from None


def read_run_config(run_dir: str, typed: bool = True):
    """RUN_DIR/config.yaml: a mapping holding every section `hybridflow run` saves (a
    truncated file loses the last ones); `typed`: its values checked against the run's
    schema (a wrong type is named by its key). UserFileError naming the file."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from hybridflow.core.loading import read_yaml
    from hybridflow.program.config import RUN_SECTIONS, RunConfig
    path = os.path.join(run_dir, "config.yaml")
    fix = "the run directory is damaged: restore config.yaml (`hybridflow run` writes it)"
    cfg = read_yaml(path, "run config", fix)
    if not isinstance(cfg, DictConfig):
        raise UserFileError(f"run config {path!r} holds a {type(cfg).__name__}, not the "
                            f"run's sections; {fix}", path)
    missing = [s for s in RUN_SECTIONS if not isinstance(cfg.get(s), (DictConfig, dict))
               and s != "algorithm"]
    if missing:
        raise UserFileError(f"run config {path!r} lacks the section(s) {missing} a run "
                            f"saves (cut short?); {fix}", path)
    if not typed:
        return cfg
    schema = OmegaConf.structured(RunConfig)
    OmegaConf.set_struct(schema, False)  # a bound role's own section is not in RunConfig
    try:
        return OmegaConf.merge(schema, cfg)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        detail = str(getattr(err, "msg", err)).splitlines()[0]
        raise UserFileError(f"run config {path!r}: bad value for '{key}' ({detail}); {fix}",
                            path) from None


def run_roles(compiled, pipeline, models: dict) -> list[str]:
    """The roles a run places: those with a model, and an async run's rollout role when
    the run put it on a pool of its own (not folded into its host)."""
    folded = compiled.placement.folded
    apart = [] if pipeline is None else [
        r for r in dict.fromkeys(pipeline.movable.values()) if r not in folded]
    return list(models) + apart
