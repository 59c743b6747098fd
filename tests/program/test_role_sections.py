"""A role of one's own gets its own config section: `workers.teacher=file.py:Teacher`
adds a `teacher` section, typed by the class's `config_schema` dataclass or
free-form; its path-like values are checked before launch (preflight.py)."""
from __future__ import annotations

import os
import textwrap

import pytest
from omegaconf.errors import ConfigAttributeError

from hybridflow.program.config import ConfigError, build_config
from hybridflow.program.assemble import prepare

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOY_BASE = os.path.join(REPO, "graphs", "assets", "toy_base")

TEACHER = '''
from dataclasses import dataclass

from hybridflow.core.constraints import at_least, checked
from hybridflow.graph.dispatch import DP, method
from hybridflow.workers.config import read_section


@dataclass
class TeacherConfig:
    path: str | None = None
    micro_batch_size: int = checked(8, at_least(1))


class Teacher:
    config_schema = TeacherConfig

    def __init__(self, cfg, ctx=None):
        self.section = read_section(cfg, "teacher", TeacherConfig)

    @method(dispatch=DP, reads=("input_ids", "responses"), writes=("teacher_log_probs",))
    def logprob(self, batch): ...


class FreeTeacher:  # no config_schema: a free-form section
    @method(dispatch=DP, reads=("input_ids", "responses"), writes=("teacher_log_probs",))
    def logprob(self, batch): ...
'''

GRAPH = '''
from hybridflow import Graph


def build(cfg):
    g = Graph("distill")
    rollout = g.call("actor.generate", g.source("prompts"))
    g.call("teacher.logprob", rollout)
    return g
'''


@pytest.fixture
def files(tmp_path):
    (tmp_path / "teacher.py").write_text(textwrap.dedent(TEACHER))
    (tmp_path / "distill.py").write_text(textwrap.dedent(GRAPH))
    return str(tmp_path / "distill.py"), str(tmp_path / "teacher.py")


def test_a_declared_section_is_typed_and_reaches_the_worker(files):
    graph, roles = files
    loaded = prepare(graph, [f"workers.teacher={roles}:Teacher", f"teacher.path={TOY_BASE}",
                             "teacher.micro_batch_size=4"])
    section = loaded.values.teacher
    assert type(section).__name__ == "TeacherConfig"
    assert (section.path, section.micro_batch_size) == (TOY_BASE, 4)
    worker = loaded.plan.bindings["teacher"](loaded.values)
    assert worker.section is section  # typed once, passed down as it is


def test_a_declared_section_refuses_typos_wrong_types_and_out_of_range(files):
    graph, roles = files
    bind = f"workers.teacher={roles}:Teacher"
    with pytest.raises(ConfigError, match=r"unknown config key 'teacher\.pth'; did you mean "
                                          r"'teacher\.path'"):
        prepare(graph, [bind, "teacher.pth=/x"])
    with pytest.raises(ConfigError, match=r"bad value for 'teacher\.micro_batch_size'"):
        prepare(graph, [bind, "teacher.micro_batch_size=many"])
    with pytest.raises(ConfigError, match=r"teacher\.micro_batch_size must be at least 1, "
                                          r"got 0"):
        prepare(graph, [bind, "teacher.micro_batch_size=0"])


def test_a_free_form_section_takes_any_key(files):
    graph, roles = files
    loaded = prepare(graph, [f"workers.teacher={roles}:FreeTeacher", "teacher.beta=0.5",
                             "teacher.name=big"])
    assert loaded.values.teacher == {"beta": 0.5, "name": "big"}
    assert loaded.cfg.teacher.beta == 0.5


def test_a_free_form_section_is_frozen_after_the_build(files):
    graph, roles = files
    loaded = prepare(graph, [f"workers.teacher={roles}:FreeTeacher", "teacher.beta=0.5"])
    with pytest.raises(ConfigAttributeError):
        loaded.cfg.teacher.betta = 1  # a typo in code reading the config is not a new key


def test_a_free_form_float_must_be_finite(files):
    graph, roles = files  # YAML's NaN is .nan (a bare `nan` is a string here: no schema)
    with pytest.raises(ConfigError, match=r"teacher\.beta must be a finite number, got nan"):
        prepare(graph, [f"workers.teacher={roles}:FreeTeacher", "teacher.beta=.nan"])


def test_the_binding_may_come_from_a_yaml_file(files, tmp_path):
    graph, roles = files
    config = tmp_path / "run.yaml"
    config.write_text(f"workers:\n  teacher: {roles}:Teacher\nteacher:\n  micro_batch_size: 2\n")
    assert prepare(graph, yaml_file=str(config)).values.teacher.micro_batch_size == 2


def test_a_section_for_an_unbound_role_says_to_bind_it():
    with pytest.raises(ConfigError, match=r"unknown config key 'teacher'.*"
                                          r"workers\.teacher=module:Class"):
        build_config(overrides=["teacher.path=/models/t"])


def test_a_role_cannot_take_the_name_of_a_run_section(files):
    _, roles = files
    with pytest.raises(ConfigError, match=r"workers\.trainer: 'trainer' is a section of the "
                                          r"run, not a role"):
        build_config(overrides=[f"workers.trainer={roles}:Teacher"])


def test_a_built_in_role_bound_to_a_user_class_keeps_its_section(files):
    _, roles = files
    cfg = build_config(overrides=[f"workers.ref={roles}:FreeTeacher", "ref.micro_batch_size=2"])
    assert cfg.ref.micro_batch_size == 2


# ------------------------------------------------------------------ preflight
def test_a_missing_model_path_of_a_role_is_refused_before_launch(files, tmp_path):
    graph, roles = files
    missing = tmp_path / "no_such_model"
    with pytest.raises(ConfigError, match=r"teacher\.path .*no_such_model"):
        prepare(graph, [f"workers.teacher={roles}:Teacher", f"teacher.path={missing}"])
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    with pytest.raises(ConfigError, match=r"teacher\.path .* has no config\.json"):
        prepare(graph, [f"workers.teacher={roles}:FreeTeacher", f"teacher.path={not_a_model}"])


def test_other_path_keys_of_a_free_form_section_must_exist(files, tmp_path):
    graph, roles = files
    with pytest.raises(ConfigError, match=r"teacher\.prompts_path='.*nope\.txt' does not "
                                          r"exist"):
        prepare(graph, [f"workers.teacher={roles}:FreeTeacher",
                        f"teacher.prompts_path={tmp_path / 'nope.txt'}"])
    existing = tmp_path / "prompts.txt"
    existing.write_text("hi")
    prepare(graph, [f"workers.teacher={roles}:FreeTeacher", f"teacher.prompts_path={existing}"])


def test_paths_are_not_checked_for_render_and_plan(files, tmp_path):
    graph, roles = files
    prepare(graph, [f"workers.teacher={roles}:Teacher", f"teacher.path={tmp_path / 'x'}"],
            preflight=False)
