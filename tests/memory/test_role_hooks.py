"""The memory model sizes each role with the hook registered for it
(hybridflow/memory/role_hooks.py), not with a chain of role names: a new role's hook
sizes it in `check --memory`, a role without one is named in a clear error, and a
built-in role rebound to a class of its own is not sized as the class it replaced."""
from __future__ import annotations

import textwrap

import pytest

from hybridflow.memory import role_hooks
from hybridflow.memory.report import plan_memory
from hybridflow.memory.role_hooks import register_role_memory, role_memory_hook
from hybridflow.program.assemble import prepare

SCORER = '''
from hybridflow.graph.dispatch import RANK_ZERO, method


class Scorer:
    @method(dispatch=RANK_ZERO, reads=("responses",), writes=("scores",))
    def score(self, batch): ...
'''
GRAPH = '''
from hybridflow import Graph


def build(cfg):
    g = Graph("scored")
    g.call("scorer.score", g.call("actor.generate", g.source("prompts")))
    return g
'''


@pytest.fixture
def hooks(monkeypatch):
    """The registry, restored after the test."""
    import hybridflow.memory.roles  # noqa: F401  (registers the built-in hooks)
    monkeypatch.setattr(role_hooks, "_HOOKS", dict(role_hooks._HOOKS))
    return role_hooks._HOOKS


def _scored(tmp_path):
    (tmp_path / "roles.py").write_text(textwrap.dedent(SCORER))
    (tmp_path / "g.py").write_text(textwrap.dedent(GRAPH))
    loaded = prepare(str(tmp_path / "g.py"), [f"workers.scorer={tmp_path / 'roles.py'}:Scorer"],
                     preflight=False)
    return loaded, {r.role: r for r in plan_memory(loaded.cfg, loaded.plan).roles}


def test_the_built_in_roles_have_hooks(hooks):
    assert {"actor", "rollout", "ref", "critic", "reward"} <= set(role_hooks.sized_roles())


def test_a_new_role_is_sized_by_the_hook_registered_for_its_class(tmp_path, hooks):
    loaded, before = _scored(tmp_path)
    assert before["scorer"].notes == ["not modeled (a worker class of its own)"]
    seen = []

    def size_scorer(memory, job):
        seen.append((job.rows, job.prompt, [n.method for n in job.nodes]))
        memory.resident = {"weights": 1000}
        memory.passes = {f"scorer.{n.method}": {"activations": 10 * job.rows}
                         for n in job.nodes}

    register_role_memory("scorer", size_scorer, worker=loaded.plan.bindings["scorer"])
    after = _scored(tmp_path)[1]["scorer"]
    rows = loaded.cfg.data.batch_size * loaded.cfg.rollout.n  # one rank
    assert seen[-1] == (rows, loaded.cfg.data.max_prompt_length, ["score"])
    assert after.resident == {"weights": 1000} and after.peak == 1000 + 10 * rows
    assert after.notes == []


def test_a_hook_for_another_class_leaves_the_role_unmodeled(tmp_path, hooks):
    register_role_memory("scorer", lambda memory, job: None, worker=type("Other", (), {}))
    assert _scored(tmp_path)[1]["scorer"].notes == ["not modeled (a worker class of its own)"]


def test_a_role_without_a_hook_is_a_clear_error(hooks):
    with pytest.raises(ValueError, match=r"no memory hook for role 'judge' \(roles with one: "
                       r"actor, critic, .*\); register one with hybridflow\.memory\.role_hooks"
                       r"\.register_role_memory\('judge', hook\)"):
        role_memory_hook("judge")


def test_registering_twice_needs_replace_and_a_hook_must_be_callable(hooks):
    with pytest.raises(ValueError, match="role 'actor' already has a memory hook; pass "
                       "replace=True"):
        register_role_memory("actor", lambda memory, job: None)
    with pytest.raises(TypeError, match="the hook must be callable, not int"):
        register_role_memory("judge", 3)
    register_role_memory("actor", print, replace=True)
    assert role_memory_hook("actor") is print
