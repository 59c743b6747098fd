"""hybridflow/program/assemble.py: a graph file plus configuration -> a compiled program
(loading, role binding, placement, compile), used by the CLI, the loop, the tests
and the benches; and the layering that keeps the CLI on top."""
from __future__ import annotations

import ast
import os
import textwrap

import pytest

from hybridflow.plan.compiler import GraphError
from hybridflow.program.config import ConfigError, RunConfig, build_config
from hybridflow.graph.builder import Graph
from hybridflow.program.assemble import (GraphFileError, LoadedGraph, compile_program, load_plan,
                                         placement_from_config, prepare, role_bindings)
from hybridflow.workers import DEFAULT_ROLES
from hybridflow.workers.config import ActorConfig, ModelConfig, read_section

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRPO = os.path.join(REPO, "graphs", "grpo.py")

SCORER = '''
from hybridflow.graph.dispatch import RANK_ZERO, method


class Scorer:
    @method(dispatch=RANK_ZERO, reads=("responses",), writes=("scores",))
    def score(self, batch): ...
'''


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_prepare_loads_binds_places_and_compiles_a_graph_file():
    loaded = prepare(GRPO, ["rollout.n=4"])
    assert isinstance(loaded, LoadedGraph)
    assert loaded.graph.name == "grpo" and loaded.cfg.rollout.n == 4
    assert {"actor", "reward"} <= set(loaded.plan.roles)
    assert loaded.plan.bindings["actor"] is DEFAULT_ROLES["actor"]
    assert loaded.plan.placement.roles["actor"] == "main"
    assert callable(loaded.module.build)


def test_the_workers_receive_typed_values_converted_once():
    loaded = prepare(GRPO, ["actor.lr=0.5", "model.device=cpu"])
    values = loaded.values
    assert isinstance(values, RunConfig) and isinstance(values.actor, ActorConfig)
    assert values.actor.lr == 0.5
    # a worker's read_section takes the typed section as it is: no second conversion
    assert read_section(values, "actor", ActorConfig) is values.actor
    assert read_section(values, "model", ModelConfig).device == "cpu"
    # the graph's section reaches the workers as plain values
    assert values.algorithm == {"norm_by_std": True}


def test_a_user_role_is_bound_from_its_file_and_placed(tmp_path):
    roles = write(tmp_path, "roles.py", SCORER)
    graph = write(tmp_path, "g.py", """\
        from hybridflow import Graph

        def build(cfg):
            g = Graph("scored")
            rollout = g.call("actor.generate", g.source("prompts"))
            g.call("scorer.score", rollout)
            return g
    """)
    plan = load_plan(graph, [f"workers.scorer={roles}:Scorer", "placement.pools.rm.nodes=1",
                             "placement.roles.scorer=rm"])
    assert plan.bindings["scorer"].__name__ == "Scorer"
    assert plan.placement.roles == {"actor": "main", "scorer": "rm"}


def test_role_bindings_start_from_the_built_in_roles():
    cfg = build_config()
    assert role_bindings(cfg) == dict(DEFAULT_ROLES)


def test_compile_program_places_an_extra_graph_like_the_run():
    cfg = build_config(overrides=["placement.pools.main.devices_per_node=2"])
    g = Graph("validation")
    g.call("reward.score", g.call("actor.generate", g.source("prompts")))
    plan = compile_program(cfg, g)
    assert plan.placement.pools["main"].world_size == 2
    assert placement_from_config(cfg, g).roles == plan.placement.roles


def test_an_unknown_role_suggests_binding_it(tmp_path):
    graph = write(tmp_path, "g.py", """\
        from hybridflow import Graph

        def build(cfg):
            g = Graph("typo")
            g.call("teachr.logprob", g.source("prompts"))
            return g
    """)
    with pytest.raises(GraphError, match=r"unknown role 'teachr': bind a worker class to "
                                         r"it with workers\.teachr=module:Class"):
        prepare(graph)


def test_a_missing_graph_file_and_a_missing_worker_file_are_named(tmp_path):
    with pytest.raises(GraphFileError, match="nope.py"):
        prepare(str(tmp_path / "nope.py"))
    with pytest.raises(ConfigError, match=r"workers\.judge: worker file .*missing\.py' does not"):
        prepare(GRPO, [f"workers.judge={tmp_path / 'missing.py'}:Judge"])


def test_placement_auto_replaces_the_placement_section(capsys):
    loaded = prepare(GRPO, ["placement=auto", "placement.cluster.devices_per_node=2"],
                     preflight=False)
    assert loaded.cfg.placement.auto is False  # the saved config replays the choice
    assert sum(p.world_size for p in loaded.plan.placement.pools.values()) <= 2
    assert "placement=auto" in capsys.readouterr().out


# ------------------------------------------------------------------ layering
def _imports(path: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def _module_file(name: str) -> str | None:
    base = os.path.join(REPO, *name.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def _reachable(start: str) -> set[str]:
    """Every hybridflow module `start` imports, directly or not (function-level
    imports included)."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if name in seen or path is None:
            continue
        seen.add(name)
        todo += [n for n in _imports(path) if n.startswith("hybridflow")]
    return seen


def test_the_loop_and_the_program_import_nothing_from_the_cli():
    for start in ("hybridflow.run.loop", "hybridflow.program.assemble"):
        cli = sorted(m for m in _reachable(start) if m.startswith("hybridflow.commands")
                     or m == "hybridflow.cli")
        assert cli == [], f"{start} reaches the CLI layer through {cli}"
    assert _module_file("hybridflow.commands.common") is None  # moved to program.py


def test_user_files_are_pickled_by_value_for_ray_workers(tmp_path):
    """A Ray worker cannot import a graph file by its private module name: its fn
    nodes must travel by value (with Ray's own cloudpickle)."""
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    import subprocess
    import sys

    from hybridflow.program.user_files import load_graph_module, pickle_user_files_by_value_for_ray
    path = write(tmp_path, "shipped.py", """\
        from hybridflow import Graph

        def double(x):
            return 2 * x

        def build(cfg):
            return Graph("shipped")
    """)
    module = load_graph_module(path)
    pickle_user_files_by_value_for_ray()
    blob = tmp_path / "fn.pkl"
    blob.write_bytes(cloudpickle.dumps(module.double))
    out = subprocess.run([sys.executable, "-c", "import pickle, sys; "
                          f"print(pickle.load(open({str(blob)!r}, 'rb'))(21))"],
                         capture_output=True, text=True, check=False)
    assert out.stdout.strip() == "42", out.stderr


def test_the_ray_runtime_settings_are_the_runtime_section():
    ray_pools = pytest.importorskip("hybridflow.runtime.ray.pools")
    from hybridflow.program.config import RuntimeConfig
    values = prepare(GRPO, ["runtime.call_timeout_s=42", "runtime.start_timeout_s=7"],
                     preflight=False).values
    settings = ray_pools.RuntimeSettings.from_config(values)
    assert (settings.call_timeout_s, settings.start_timeout) == (42.0, 7.0)
    # no second set of defaults: an absent section or key is RuntimeConfig's default
    default = ray_pools.RuntimeSettings.from_config({"runtime": {"call_timeout_s": 60}})
    assert default.start_timeout == RuntimeConfig().start_timeout_s
    assert ray_pools.RuntimeSettings.from_config({}).torch_threads == RuntimeConfig().torch_threads
