"""A graph file plus configuration, turned into a compiled program: what the CLI,
the step loop, the tests and the benches start from.

`prepare(graph.py, overrides, yaml)`:
  1. import the graph file (`user_files.py`); call its `defaults()`;
  2. build the run config once (`config.build_config`), typed by the graph's
     `ALGORITHM` dataclass and by each bound role's `config_schema`, every value
     checked; convert it once to typed values (`config.run_values`) for the workers;
  3. call `build(cfg)`; bind each role to its worker class (`workers.<role>`);
  4. place the roles (the `placement` section, or the planner with `placement=auto`)
     and compile;
  5. (with `preflight`) check the paths and batch sizes the run needs (preflight.py).
Stateless: everything a run needs is in the returned `LoadedGraph`.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from types import ModuleType

from omegaconf import DictConfig, OmegaConf, open_dict

from hybridflow.program.auto_placement import expand_auto, plan_auto_placement
from hybridflow.plan.async_split import attach_staleness
from hybridflow.plan.streaming_split import StreamBackend, attach_streaming
from hybridflow.plan.balance import insert_token_balance
from hybridflow.plan.unneeded import drop_unneeded, rows_bound
from hybridflow.plan.compiler import ExecutionPlan, compile_graph
from hybridflow.program.config import (ConfigError, ParallelConfig, PoolConfig, RunConfig,
                                       build_config, run_values)
from hybridflow.graph.builder import Graph
from hybridflow.core.modes import run_modes
from hybridflow.core.kinds import Op
from hybridflow.core.worker_hooks import (config_schema, input_sources, optimizer_steps,
                                          served_by)
from hybridflow.plan.placement import Placement
from hybridflow.program.placement_checks import check_placement_names, check_pool_cores
from hybridflow.program.user_files import (GraphFileError, call_graph_file, import_object,
                                           load_graph_module)

__all__ = ["GraphFileError", "LoadedGraph", "load_graph_module", "load_plan", "prepare",
           "role_bindings", "placement_from_config", "folded_roles", "compile_program",
           "algorithm_schema", "role_schema"]


@dataclass
class LoadedGraph:
    module: ModuleType       # the graph file
    cfg: DictConfig          # the merged, checked config (saved with the run; build(cfg))
    graph: Graph
    plan: ExecutionPlan
    values: RunConfig        # the same config as typed values: what the workers receive


def algorithm_schema(module: ModuleType, path: str) -> type | None:
    """The graph file's `ALGORITHM` dataclass: the schema of the `algorithm` section.
    A file that imports its `build` from another graph file (`from hybridflow.graphs.grpo import
    build`) gets that file's schema with it. None: the section is free-form."""
    schema = getattr(module, "ALGORITHM", None)
    if schema is None:
        home = sys.modules.get(getattr(module.build, "__module__", None) or "")
        schema = getattr(home, "ALGORITHM", None) if home is not module else None
    if schema is not None and not (isinstance(schema, type) and
                                   hasattr(schema, "__dataclass_fields__")):
        raise GraphFileError(f"ALGORITHM in {path!r} must be a dataclass (the algorithm "
                             f"section's fields and defaults), got {schema!r}")
    return schema


def role_schema(role: str, spec: str) -> type | None:
    """The `config_schema` dataclass of the worker class bound to `role` (None: its
    section is free-form)."""
    cls = import_object(spec, f"workers.{role}")
    return config_schema(cls)


def role_bindings(cfg: DictConfig) -> dict[str, type]:
    from hybridflow.workers import DEFAULT_ROLES
    bindings = dict(DEFAULT_ROLES)
    for role, spec in (cfg.workers or {}).items():
        bindings[str(role)] = import_object(str(spec), f"workers.{role}")
    return bindings


def folded_roles(cfg: DictConfig, bindings: dict[str, type]) -> dict[str, str]:
    """role -> the colocated role that serves it, from each worker class's
    `served_by(cfg)` (e.g. the reference of a LoRA actor is the actor, adapters off)."""
    folded = {}
    for role, cls in bindings.items():
        host = served_by(cls, cfg)
        if host is not None and host != role:
            folded[role] = host
    return folded


def placement_from_config(cfg: DictConfig, graph: Graph,
                          bindings: dict[str, type] | None = None) -> Placement:
    """The `placement` section; a role it does not place goes to the first pool, or
    to its host's pool when another role serves it (folded)."""
    section = OmegaConf.to_container(cfg.placement, resolve=True)
    section["parallel"] = {role: {k: v for k, v in layout.items() if v is not None}
                           for role, layout in (section.get("parallel") or {}).items()}
    if not section.get("pools"):
        raise ConfigError("placement.pools is empty: define at least one pool")
    first = next(iter(section["pools"]))
    roles = dict(section.get("roles") or {})
    bound = role_bindings(cfg) if bindings is None else bindings
    folded = folded_roles(cfg, bound)
    used = [n.role for n in graph.nodes.values() if n.op is Op.CALL]
    check_placement_names(section, set(used) | set(bound))  # before defaults fill it
    for role in sorted(dict.fromkeys(used), key=lambda r: r in folded):  # hosts first
        if role not in roles:
            roles[role] = roles.get(folded.get(role), first)
    section["roles"] = roles
    try:
        placement = Placement.from_config(section)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None
    placement.folded = {r: h for r, h in folded.items() if r in used}
    check_pool_cores(placement.pools, local=not cfg.runtime.address)
    return placement


def compile_program(cfg: DictConfig, graph: Graph,
                    bindings: dict[str, type] | None = None) -> ExecutionPlan:
    """Bind, place (from the config) and compile one graph, e.g. the validation graph;
    without the nodes it does not need unless `trainer.keep_unneeded_passes`."""
    bindings = role_bindings(cfg) if bindings is None else bindings
    plan = compile_graph(graph, bindings, placement_from_config(cfg, graph, bindings))
    if cfg.trainer.get("keep_unneeded_passes", False):
        return plan
    return drop_unneeded(plan, _steps_per_batch(cfg, plan), lambda node: input_sources(
        plan.bindings[node.role], cfg, node.method))


def _steps_per_batch(cfg: DictConfig, plan: ExecutionPlan):
    """steps(node) -> (optimizer steps a training node makes per batch, the most rows
    it can receive): the rows from `data.batch_size` and each generate node's `n`
    (its argument, else `rollout.n`), the steps from the worker's `optimizer_steps`."""
    def repeats(node) -> int | None:
        n = node.kwargs.get("n", cfg.rollout.n)
        return int(n) if isinstance(n, int) else None

    def steps(node):
        rows = rows_bound(plan, node.name, int(cfg.data.batch_size), repeats)
        if rows is None:
            return None, None
        return optimizer_steps(plan.bindings[node.role], cfg, node.method, node.kwargs,
                               rows), rows
    return steps


def prepare(graph_path: str, overrides: list[str] | None = None,
            yaml_file: str | None = None, preflight: bool = True) -> LoadedGraph:
    """Load the graph file, build its config, build and compile the graph, then (with
    `preflight`) check the paths and batch sizes the run will need; see preflight.py."""
    module = load_graph_module(graph_path)
    defaults = call_graph_file(graph_path, "defaults()", module.defaults) \
        if callable(getattr(module, "defaults", None)) else None
    if defaults is not None and not isinstance(defaults, (dict, DictConfig)):
        raise GraphFileError(f"defaults() in {graph_path!r} returned {type(defaults).__name__}; "
                             f"it must return a dict of config sections (or None)")
    cfg = build_config(defaults, yaml_file, expand_auto(overrides),
                       algorithm=algorithm_schema(module, graph_path), role_schema=role_schema)
    graph = call_graph_file(graph_path, "build(cfg)", module.build, cfg)
    if not isinstance(graph, Graph):
        raise GraphFileError(f"build(cfg) in {graph_path!r} returned "
                             f"{type(graph).__name__}, not a hybridflow Graph")
    bindings = role_bindings(cfg)
    plan = compile_program(cfg, graph, bindings)
    if cfg.placement.auto:
        plan = _auto_place(cfg, graph, bindings, plan)
    if cfg.trainer.balance_batch:
        plan = insert_token_balance(plan)
    plan = _attach_async(cfg, plan)
    if preflight:
        from hybridflow.program.preflight import preflight as check_run
        check_run(cfg, plan)
    return LoadedGraph(module, cfg, graph, plan, run_values(cfg))


def _attach_async(cfg: DictConfig, plan):
    """The plan's buffers for `trainer.staleness` and `trainer.async_mode`."""
    trainer, modes = cfg.trainer, run_modes(cfg)
    corrects = lambda node: _default_loss_corrects(cfg, node)  # noqa: E731
    if not modes.async_mode.streams:
        return attach_staleness(plan, trainer.staleness, trainer.allow_uncorrected_async,
                                corrects)
    if trainer.staleness < 1:
        raise ConfigError("trainer.async_mode=streaming needs trainer.staleness >= 1 (how "
                          "many updates old a sample's oldest token may be); got "
                          f"trainer.staleness={trainer.staleness}; set trainer.staleness=1 "
                          "or trainer.async_mode=pipeline")
    return attach_streaming(plan, trainer.staleness, trainer.allow_uncorrected_async, corrects,
                            _stream_backend(str(cfg.rollout.backend)), modes.stream_side)


def _stream_backend(name: str) -> StreamBackend:
    """The engine registry's streaming declaration of `rollout.backend`, for the
    compiler's check (plan/streaming_split.py)."""
    from hybridflow.workers.rollout.engine import engine_streams, streaming_engines
    return StreamBackend(name, engine_streams(name), tuple(streaming_engines()))


def _default_loss_corrects(cfg: DictConfig, node) -> bool:
    """A training call without `loss=` gets its role's default loss, built from the
    role's section: it corrects for stale samples when `<role>.off_policy` says so."""
    if node.kwargs.get("loss") is not None:
        return False
    section = cfg.get(node.role) if node.role in cfg else None
    return section is not None and str(section.get("off_policy", "none")) != "none"


def _auto_place(cfg: DictConfig, graph: Graph, bindings, plan: ExecutionPlan) -> ExecutionPlan:
    """Replace the placement section with the planner's choice and compile again."""
    section, explanation = plan_auto_placement(cfg, plan)
    with open_dict(cfg):
        cfg.placement.pools = {name: PoolConfig(**pool)
                               for name, pool in section["pools"].items()}
        cfg.placement.roles = section["roles"]
        cfg.placement.parallel = {role: ParallelConfig(**layout)
                                  for role, layout in section.get("parallel", {}).items()}
        cfg.placement.auto = False  # the saved config replays this exact placement
    from hybridflow.core.printable import echo
    echo(f"placement=auto:\n{explanation}")  # names the user's roles and pools
    return compile_program(cfg, graph, bindings)


def load_plan(graph_path: str, overrides: list[str] | None = None,
              yaml_file: str | None = None) -> ExecutionPlan:
    """The plan only (render, plan): the paths it names need not exist here."""
    return prepare(graph_path, overrides, yaml_file, preflight=False).plan
