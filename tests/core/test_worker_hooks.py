"""The optional worker hooks (hybridflow/core/worker_hooks.py): declared once with their
defaults, read everywhere through its functions, and declared by the built-in roles
the way the protocol says."""
from __future__ import annotations

import ast
import dataclasses
import glob
import os

import pytest

from hybridflow.agents.worker import AgentRolloutWorker
from hybridflow.core import worker_hooks
from hybridflow.core.worker_hooks import (HOOKS, WorkerHooks, check_section, config_schema,
                                          host_role, reports_held_tensors, served_by)
from hybridflow.workers import DEFAULT_ROLES, Worker

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "hybridflow")


class Plain:
    """A role that declares no hook and inherits nothing."""


@dataclasses.dataclass
class Section:
    size: int = 1


class Declares(WorkerHooks):
    HOST_ROLE = "actor"
    config_schema = Section

    @classmethod
    def served_by(cls, cfg):
        return cfg["host"]

    @classmethod
    def check_section(cls, section):
        raise ValueError(f"refused {section}")

    def held_tensors(self):
        return {"process": "p", "weights": {}, "optimizer": {}}


@pytest.mark.parametrize("cls", [Plain, WorkerHooks], ids=["plain class", "WorkerHooks"])
def test_a_class_that_declares_nothing_gets_every_default(cls):
    assert host_role(cls) is None
    assert served_by(cls, {"host": "actor"}) is None
    assert config_schema(cls) is None
    assert check_section(cls, {"any": 1}) is None
    assert not reports_held_tensors(cls)


def test_declared_hooks_are_read():
    assert host_role(Declares) == "actor"
    assert served_by(Declares, {"host": "teacher"}) == "teacher"
    assert config_schema(Declares) is Section
    with pytest.raises(ValueError, match="refused x"):
        check_section(Declares, "x")
    assert reports_held_tensors(Declares)


def test_the_protocol_declares_every_hook_it_names():
    assert set(HOOKS) <= set(vars(WorkerHooks)), set(HOOKS) - set(vars(WorkerHooks))
    for hook in HOOKS:
        assert f"`{hook}" in worker_hooks.__doc__, f"{hook} is not documented"


def test_the_built_in_roles_declare_hooks_of_the_protocol_s_types():
    for role, cls in {**DEFAULT_ROLES, "agent": AgentRolloutWorker}.items():
        assert issubclass(cls, WorkerHooks), role
        assert host_role(cls) is None or host_role(cls) in DEFAULT_ROLES, role
        schema = config_schema(cls)
        assert schema is None or dataclasses.is_dataclass(schema), role
        assert reports_held_tensors(cls), role  # Worker reports the storages it holds
    assert issubclass(Worker, WorkerHooks)


def _hook_lookups(path: str) -> list[str]:
    """`getattr(x, "<hook>")` / `hasattr(x, "<hook>")` calls of a file, by line."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in HOOKS):
            found.append(f"{os.path.relpath(path, PACKAGE)}:{node.lineno} "
                         f"{node.func.id}(..., {node.args[1].value!r})")
    return found


def test_the_engine_reads_hooks_only_through_worker_hooks():
    own = os.path.join(PACKAGE, "core", "worker_hooks.py")
    found = [hit for path in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True)
             if path != own for hit in _hook_lookups(path)]
    assert not found, f"read these through hybridflow.core.worker_hooks: {found}"
