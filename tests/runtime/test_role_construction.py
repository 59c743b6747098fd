"""Issue 26 class 11: a worker class that fails in its constructor is named — role,
class, the file:line where the class is defined and where it failed, and the cause —
on the local runtime and in the Ray worker shell (the code a Ray actor runs to
construct its roles), for every kind of failure. A worker written against the docs
before the typed RunConfig (`dict(cfg)`, `cfg["teacher"]`) still works, with a
FutureWarning saying what to write instead."""
from __future__ import annotations

import textwrap
import warnings

import pytest

from hybridflow.core.origin import RoleStartError
from hybridflow.program.assemble import prepare
from hybridflow.program.config import RunConfig
from hybridflow.runtime.local import LocalRuntime
from hybridflow.runtime.worker_shell import FusedWorker, WorkerError

ROLES = '''
import sys

from hybridflow.graph.dispatch import DP, method
from hybridflow.workers.config import ActorConfig, read_section


class Base:
    @method(dispatch=DP, reads=("input_ids",), writes=("teacher_score",))
    def score(self, batch): ...


class OldDict(Base):  # the docs before the typed RunConfig: cfg was a DictConfig
    def __init__(self, cfg, ctx=None):
        values = dict(cfg)
        self.beta = values["teacher"]["beta"]
        self.lr = values["actor"]["lr"]
        self.actor = read_section(values, "actor", ActorConfig)


class Iterates(Base):
    def __init__(self, cfg, ctx=None):
        self.names = [name for name in cfg]


class Raises(Base):
    def __init__(self, cfg, ctx=None):
        raise ValueError("no teacher weights here")


class MissingKey(Base):
    def __init__(self, cfg, ctx=None):
        self.x = cfg.teacher["gamma"]


class Exits(Base):
    def __init__(self, cfg, ctx=None):
        sys.exit(3)


class BadAttribute(Base):
    def __init__(self, cfg, ctx=None):
        self.x = cfg.teacher_section.beta


class Helper(Base):
    def __init__(self, cfg, ctx=None):
        self.x = _load(cfg)


def _load(cfg):
    return 1 / 0
'''

GRAPH = '''
from hybridflow import Graph


def build(cfg):
    g = Graph("teach")
    g.call("teacher.score", g.source("prompts"))
    return g
'''

FAILING = {  # class -> (cause, the line of ROLES that failed)
    "Raises": ("ValueError: no teacher weights here", "raise ValueError"),
    "MissingKey": ("KeyError: 'gamma'", 'cfg.teacher["gamma"]'),
    "Exits": ("called sys.exit(3)", "sys.exit(3)"),
    "BadAttribute": ("AttributeError: ", "cfg.teacher_section.beta"),
    "Helper": ("ZeroDivisionError: division by zero", "return 1 / 0"),
}


@pytest.fixture
def files(tmp_path):
    (tmp_path / "roles.py").write_text(textwrap.dedent(ROLES))
    (tmp_path / "teach.py").write_text(textwrap.dedent(GRAPH))
    RunConfig._warned[0] = False
    return str(tmp_path / "teach.py"), str(tmp_path / "roles.py")


def _loaded(files, cls):
    graph, roles = files
    return prepare(graph, [f"workers.teacher={roles}:{cls}", "teacher.beta=0.5"],
                   preflight=False)


def _line_of(path, text) -> int:
    lines = open(path).read().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _assert_names_everything(message, roles, cls, cause, line_text):
    first = message.strip().splitlines()[0]
    class_line = _line_of(roles, f"class {cls}(")
    assert f"role 'teacher' ({cls}, {roles}:{class_line})" in first, first
    assert f"{roles}:{_line_of(roles, line_text)}" in first, first
    assert cause in first, first


@pytest.mark.parametrize("cls", sorted(FAILING))
def test_local_runtime_names_role_class_line_and_cause(files, cls):
    loaded = _loaded(files, cls)
    with pytest.raises(RoleStartError) as err:
        LocalRuntime(loaded.plan, loaded.values)
    _assert_names_everything(str(err.value), files[1], cls, *FAILING[cls])
    assert err.value.role == "teacher"


def _ray_context(rank, world_size, local_rank, device, seed, colocated):
    from hybridflow.core.context import WorkerContext
    return WorkerContext(rank=rank, world_size=world_size, local_rank=local_rank,
                         device="cpu", seed=seed, colocated=colocated)


@pytest.mark.parametrize("cls", sorted(FAILING))
def test_ray_worker_shell_names_role_class_line_and_cause(files, cls):
    """What a Ray actor runs (`FusedWorker.start`); the driver's headline is the
    first line of this detail (ray/pools.py `_get_all`)."""
    loaded = _loaded(files, cls)
    shell = FusedWorker("main", 0, 1, 0, torch_threads=None)
    with pytest.raises(WorkerError) as err:
        shell.start({}, loaded.values, ["teacher"], loaded.plan.bindings, 0, _ray_context)
    _assert_names_everything(err.value.detail, files[1], cls, *FAILING[cls])
    assert "Traceback" in err.value.detail  # the full traceback follows, for status.json


def test_iterating_the_config_works_with_a_warning_naming_the_reader(files):
    loaded = _loaded(files, "Iterates")
    with pytest.warns(FutureWarning, match=r"read_section\(cfg, 'actor', ActorConfig\)"):
        runtime = LocalRuntime(loaded.plan, loaded.values)
    assert "teacher" in runtime.workers("teacher")[0].names


def test_a_worker_written_against_the_old_docs_still_runs(files):
    loaded = _loaded(files, "OldDict")
    with pytest.warns(FutureWarning, match="docs/workers.md#migrating-a-worker-class"):
        runtime = LocalRuntime(loaded.plan, loaded.values)
    worker = runtime.workers("teacher")[0]
    assert worker.beta == 0.5 and worker.lr == loaded.values.actor.lr
    assert worker.actor == loaded.values.actor  # the section reader takes the mapping too


def test_the_mapping_view_warns_once_and_names_a_missing_section(files):
    values = _loaded(files, "OldDict").values
    with pytest.warns(FutureWarning):
        assert values["trainer"]["steps"] == values.trainer.steps
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert set(values.keys()) >= {"trainer", "actor", "teacher"}
        with pytest.raises(KeyError, match="no section 'nope'"):
            values["nope"]


@pytest.mark.ray
@pytest.mark.slow  # a Ray session (~10 s)
def test_on_ray_the_driver_headline_names_role_class_line_and_cause(files):
    from hybridflow.runtime.ray.executor import RayRuntime
    graph, roles = files
    loaded = prepare(graph, ["workers.teacher=" + roles + ":Raises", "teacher.beta=0.5",
                             "runtime.name=ray", "runtime.num_cpus=2"], preflight=False)
    with pytest.raises(RuntimeError) as err:
        RayRuntime(loaded.plan, loaded.values)
    first = str(err.value).splitlines()[0]
    assert first.startswith("pool 'main' roles ['teacher']: constructing failed on rank 0: ")
    _assert_names_everything(first.split("rank 0: ", 1)[1], roles, "Raises",
                             *FAILING["Raises"])
