"""Turning a graph file plus configuration into a compiled plan (shared by commands).

User code is only ever loaded from paths the user names: the graph file given on
the command line, and worker classes named in `workers.<role>`.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from types import ModuleType

from omegaconf import DictConfig, OmegaConf, open_dict

from hybridflow.auto_placement import expand_auto, plan_auto_placement
from hybridflow.compiler import ExecutionPlan, compile_graph
from hybridflow.config import ConfigError, build_config
from hybridflow.graph import Graph
from hybridflow.placement import Placement
from hybridflow.user_code import exec_user_file as _exec_user_file

__all__ = ["GraphFileError", "LoadedGraph", "load_graph_module", "load_plan", "prepare",
           "role_bindings", "placement_from_config", "folded_roles"]


class GraphFileError(ValueError):
    """The graph file is missing, does not import, or does not export build(cfg)."""


def load_graph_module(path: str) -> ModuleType:
    if not os.path.isfile(path):
        raise GraphFileError(f"graph file {path!r} does not exist")
    path = os.path.abspath(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    digest = hashlib.sha1(path.encode()).hexdigest()[:8]
    name = f"hybridflow_user_graph_{stem}_{digest}"
    module = _exec_user_file(path, name, GraphFileError, "graph file")
    if not callable(getattr(module, "build", None)):
        del sys.modules[name]
        raise GraphFileError(f"graph file {path!r} must export build(cfg) -> Graph")
    return module


def _import_object(spec: str):
    """'package.module:Name' or 'path/to/file.py:Name'."""
    target, _, attr = spec.partition(":")
    if not attr:
        raise ConfigError(f"worker class {spec!r} must be 'module:Class' or 'file.py:Class'")
    if target.endswith(".py"):
        module = _load_file(target)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as err:
            raise ConfigError(f"cannot import worker module {target!r}: {err}") from None
    if not hasattr(module, attr):
        raise ConfigError(f"{target!r} has no attribute {attr!r}")
    return getattr(module, attr)


def _load_file(path: str) -> ModuleType:
    if not os.path.isfile(path):
        raise ConfigError(f"worker file {path!r} does not exist")
    name = "hybridflow_user_" + hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:10]
    return _exec_user_file(path, name, ConfigError, "worker file")


def _call_graph_file(path: str, what: str, fn, *args):
    """Call the graph file's defaults() or build(cfg); its own errors name the file:line."""
    try:
        return fn(*args)
    except (ConfigError, GraphFileError):
        raise
    except Exception as err:
        target, line = os.path.abspath(path), None
        tb = err.__traceback__
        while tb is not None:  # the innermost frame in the user's file
            if os.path.abspath(tb.tb_frame.f_code.co_filename) == target:
                line = tb.tb_lineno
            tb = tb.tb_next
        where = f" at {os.path.basename(path)}:{line}" if line else ""
        detail = str(err).splitlines()[0] if str(err) else ""
        raise GraphFileError(f"{what} in {path!r} raised {type(err).__name__}{where}: "
                             f"{detail}") from err


def role_bindings(cfg: DictConfig) -> dict[str, type]:
    from hybridflow.workers import DEFAULT_ROLES
    bindings = dict(DEFAULT_ROLES)
    for role, spec in (cfg.workers or {}).items():
        bindings[str(role)] = _import_object(str(spec))
    return bindings


def folded_roles(cfg: DictConfig, bindings: dict[str, type]) -> dict[str, str]:
    """role -> the colocated role that serves it, from each worker class's
    `served_by(cfg)` (e.g. the reference of a LoRA actor is the actor, adapters off)."""
    folded = {}
    for role, cls in bindings.items():
        host = cls.served_by(cfg) if callable(getattr(cls, "served_by", None)) else None
        if host is not None and host != role:
            folded[role] = host
    return folded


def placement_from_config(cfg: DictConfig, graph: Graph,
                          bindings: dict[str, type] | None = None) -> Placement:
    """The `placement` section; a role it does not place goes to the first pool, or
    to its host's pool when another role serves it (folded)."""
    section = OmegaConf.to_container(cfg.placement, resolve=True)
    if not section.get("pools"):
        raise ConfigError("placement.pools is empty: define at least one pool")
    first = next(iter(section["pools"]))
    roles = dict(section.get("roles") or {})
    folded = folded_roles(cfg, role_bindings(cfg) if bindings is None else bindings)
    used = [n.role for n in graph.nodes.values() if n.op == "call"]
    for role in sorted(dict.fromkeys(used), key=lambda r: r in folded):  # hosts first
        if role not in roles:
            roles[role] = roles.get(folded.get(role), first)
    section["roles"] = roles
    try:
        placement = Placement.from_config(section)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None
    placement.folded = {r: h for r, h in folded.items() if r in used}
    return placement


@dataclass
class LoadedGraph:
    module: ModuleType
    cfg: DictConfig
    graph: Graph
    plan: ExecutionPlan


def prepare(graph_path: str, overrides: list[str] | None = None,
            yaml_file: str | None = None, preflight: bool = True) -> LoadedGraph:
    """Load the graph file, merge its config, build and compile the graph, then (with
    `preflight`) check the paths and batch sizes the run will need; see preflight.py."""
    module = load_graph_module(graph_path)
    defaults = _call_graph_file(graph_path, "defaults()", module.defaults) \
        if callable(getattr(module, "defaults", None)) else None
    cfg = build_config(defaults, yaml_file, expand_auto(overrides))
    graph = _call_graph_file(graph_path, "build(cfg)", module.build, cfg)
    if not isinstance(graph, Graph):
        raise GraphFileError(f"build(cfg) in {graph_path!r} returned "
                             f"{type(graph).__name__}, not a hybridflow Graph")
    bindings = role_bindings(cfg)
    plan = compile_graph(graph, bindings, placement_from_config(cfg, graph, bindings))
    if cfg.placement.auto:
        plan = _auto_place(cfg, graph, bindings, plan)
    if preflight:
        from hybridflow.preflight import preflight as check_run
        check_run(cfg, plan)
    return LoadedGraph(module, cfg, graph, plan)


def _auto_place(cfg: DictConfig, graph: Graph, bindings, plan: ExecutionPlan) -> ExecutionPlan:
    """Replace the placement section with the planner's choice and compile again."""
    section, explanation = plan_auto_placement(cfg, plan)
    with open_dict(cfg):
        cfg.placement.pools = section["pools"]
        cfg.placement.roles = section["roles"]
        cfg.placement.parallel = section.get("parallel", {})
        cfg.placement.auto = False  # the saved config replays this exact placement
    print(f"placement=auto:\n{explanation}")
    return compile_graph(graph, bindings, placement_from_config(cfg, graph, bindings))


def load_plan(graph_path: str, overrides: list[str] | None = None,
              yaml_file: str | None = None) -> ExecutionPlan:
    """The plan only (render, plan): the paths it names need not exist here."""
    return prepare(graph_path, overrides, yaml_file, preflight=False).plan
