"""`hybridflow check graph.py [key=value ...]` (hybridflow/commands/check.py and
hybridflow/program/assemble.py): compile only, print a summary, exit 1 with the message on any
error; neither Ray nor model libraries are loaded (its speed: bench/check.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from hybridflow.cli import main
from hybridflow.program.assemble import GraphFileError, load_graph_module, prepare
from hybridflow.program.config import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKES = os.path.join(REPO, "tests", "support", "fakes.py")

PPO = '''
from hybridflow import Graph
from hybridflow.graph.builder import node_fn


@node_fn(reads=("scores", "values", "response_mask"), writes=("advantages", "returns"))
def gae(batch, gamma=1.0): ...


def defaults():
    return {"rollout": {"n": 2}, "algorithm": {"gamma": 0.99}}


def build(cfg):
    g = Graph("ppo_test")
    prompts = g.source("prompts")
    rollout = g.call("actor.generate", prompts, n=cfg.rollout.n)
    old = g.call("actor.logprob", rollout)
    values = g.call("critic.values", rollout)
    score = g.call("scorer.score", rollout)
    adv = g.fn(gae, rollout, values, score, gamma=cfg.algorithm.gamma)
    g.call("actor.update", rollout, old, adv)
    g.call("critic.update", rollout, values, adv)
    return g
'''


@pytest.fixture
def files(tmp_path):
    """A PPO-shaped graph file and the shared fake roles (tests/support/fakes.py, which
    carry the real workers' contracts) bound by `workers.<role>=file.py:Class`."""
    (tmp_path / "ppo.py").write_text(PPO)
    overrides = [f"workers.actor={FAKES}:FakeActor", f"workers.critic={FAKES}:FakeCritic",
                 f"workers.scorer={FAKES}:FakeReward"]
    return tmp_path, str(tmp_path / "ppo.py"), overrides


def write_graph(tmp_path, body: str, name: str = "graph.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def check(capsys, *argv) -> tuple[int, str, str]:
    code = main(["check", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


# ------------------------------------------------------------------ success
def test_check_prints_the_summary(files, capsys):
    _, graph, overrides = files
    code, out, err = check(capsys, graph, *overrides)
    assert code == 0, err
    assert "graph 'ppo_test': 8 nodes" in out and out.rstrip().endswith("ok")
    assert "roles actor, critic, scorer" in out
    assert "pool main: 1 device(s), colocated roles: actor, critic, scorer" in out
    assert "concurrency:" in out and "gae" in out


def test_check_reads_graph_defaults_yaml_and_overrides(files, tmp_path):
    _, graph, overrides = files
    yaml = tmp_path / "run.yaml"
    yaml.write_text("rollout:\n  n: 3\nalgorithm:\n  gamma: 0.5\n")
    loaded = prepare(graph, overrides + ["algorithm.gamma=0.25"], str(yaml))
    assert loaded.plan.node("actor.generate").kwargs == {"n": 3}
    assert loaded.plan.node("gae").kwargs == {"gamma": 0.25}
    assert prepare(graph, overrides).plan.node("actor.generate").kwargs == {"n": 2}


def test_check_with_a_placement_on_two_pools(files, capsys):
    _, graph, overrides = files
    code, out, err = check(capsys, graph, *overrides, "placement.pools.rm.nodes=1",
                           "placement.roles.scorer=rm")
    assert code == 0, err
    assert "scorer@rm" in out and "pool rm: 1 device(s), colocated roles: scorer" in out


def test_check_in_a_subprocess_imports_neither_ray_nor_model_libraries(files):
    """How fast `check` is belongs to bench/check.py; here, what it must not load."""
    _, graph, overrides = files
    script = textwrap.dedent(f"""
        import sys
        from hybridflow.cli import main
        code = main(["check", {graph!r}, *{overrides!r}])
        heavy = sorted(m for m in sys.modules
                       if m.split(".")[0] in ("ray", "vllm", "transformers"))
        assert code == 0, code
        assert "ray" not in sys.modules, heavy
        assert not heavy, heavy
        print("light")
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "light" in proc.stdout


def test_console_entry_point_exit_codes(files, tmp_path):
    _, graph, overrides = files
    bad = subprocess.run([sys.executable, "-m", "hybridflow", "check",
                          str(tmp_path / "missing.py")], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "does not exist" in bad.stderr
    assert "Traceback" not in bad.stderr


# ------------------------------------------------------------------ errors
def test_missing_graph_file(tmp_path, capsys):
    code, out, err = check(capsys, str(tmp_path / "nope.py"))
    assert code == 1 and "hybridflow check:" in err and "nope.py' does not exist" in err
    assert out == ""


def test_graph_file_without_build(tmp_path, capsys):
    path = write_graph(tmp_path, "X = 1\n")
    code, _, err = check(capsys, path)
    assert code == 1 and "must export build(cfg) -> Graph" in err
    with pytest.raises(GraphFileError, match="must export build"):  # not cached as valid
        load_graph_module(path)


def test_build_that_raises_names_the_file_line(tmp_path, capsys):
    path = write_graph(tmp_path, """\
        def helper():
            raise RuntimeError("no reward function configured")

        def build(cfg):
            return helper()
    """)
    code, _, err = check(capsys, path)
    assert code == 1
    assert "build(cfg)" in err and "raised RuntimeError at graph.py:2" in err
    assert "no reward function configured" in err and "Traceback" not in err


def test_build_reading_an_unset_config_key(tmp_path, capsys):
    path = write_graph(tmp_path, """\
        def build(cfg):
            return cfg.algorithm.kl_coef
    """)
    code, _, err = check(capsys, path)
    assert code == 1 and "graph.py:2" in err and "kl_coef" in err


def test_defaults_that_raise_or_name_unknown_keys(tmp_path, capsys):
    raising = write_graph(tmp_path, """\
        def defaults():
            return {"rollout": {"n": 1 / 0}}

        def build(cfg): ...
    """, "raising.py")
    code, _, err = check(capsys, raising)
    assert code == 1 and "defaults()" in err and "ZeroDivisionError at raising.py:2" in err
    typo = write_graph(tmp_path, """\
        def defaults():
            return {"rollout": {"nn": 1}}

        def build(cfg): ...
    """, "typo.py")
    code, _, err = check(capsys, typo)
    assert code == 1 and "unknown config key 'rollout.nn'" in err and "'rollout.n'" in err


def test_graph_file_that_does_not_import(tmp_path, capsys):
    code, _, err = check(capsys, write_graph(tmp_path, "def build(cfg:\n"))
    assert code == 1 and "failed to import: SyntaxError" in err


def test_build_returning_something_else(tmp_path, capsys):
    code, _, err = check(capsys, write_graph(tmp_path, "def build(cfg):\n    return 3\n"))
    assert code == 1 and "returned int, not a hybridflow Graph" in err


def test_graph_errors_name_the_node_and_line(files, capsys):
    tmp_path, _, overrides = files
    path = write_graph(tmp_path, """\
        from hybridflow import Graph

        def build(cfg):
            g = Graph("broken")
            prompts = g.source()
            g.call("actor.genrate", prompts)
            g.call("scorr.score", prompts)
            return g
    """)
    code, out, err = check(capsys, path, *overrides)
    assert code == 1 and out == ""
    assert "graph 'broken' has 2 problem(s)" in err
    assert "node 'actor.genrate' (graph.py:6)" in err and "did you mean 'generate'" in err
    assert "node 'scorr.score' (graph.py:7)" in err and "did you mean 'scorer'" in err


def test_key_errors_name_the_node_and_line(files, capsys):
    tmp_path, _, overrides = files
    path = write_graph(tmp_path, """\
        from hybridflow import Graph

        def build(cfg):
            g = Graph("keys")
            g.call("scorer.score", g.source())
            return g
    """)
    code, _, err = check(capsys, path, *overrides)
    assert code == 1 and "node 'scorer.score' (graph.py:5)" in err
    assert "reads key 'responses'" in err


def test_bad_override(files, capsys):
    _, graph, overrides = files
    code, _, err = check(capsys, graph, *overrides, "trainer.step=3")
    assert code == 1 and "did you mean 'trainer.steps'" in err
    code, _, err = check(capsys, graph, *overrides, "trainer.steps")
    assert code == 1 and "not of the form key=value" in err


def test_missing_yaml(files, capsys, tmp_path):
    _, graph, overrides = files
    code, _, err = check(capsys, graph, *overrides, "-c", str(tmp_path / "none.yaml"))
    assert code == 1 and "none.yaml' does not exist" in err


@pytest.mark.parametrize("spec, words", [
    ("{dir}/absent.py:Actor", "worker file"),
    ("{fakes}:Nope", "defines no 'Nope'"),
    ("{fakes}", "must name a worker class as 'package.module:NAME'"),
    ("no_such_module_xyz:Actor", "cannot import module 'no_such_module_xyz'"),
    ("{dir}/broken.py:Actor", "failed to import: NameError"),
])
def test_bad_worker_binding(files, capsys, spec, words):
    tmp_path, graph, overrides = files
    (tmp_path / "broken.py").write_text("undefined_name\n")
    code, _, err = check(capsys, graph, *overrides,
                         f"workers.actor={spec.format(dir=tmp_path, fakes=FAKES)}")
    assert code == 1 and words in err, err


def test_unknown_pool_field(files, capsys):
    _, graph, overrides = files
    code, _, err = check(capsys, graph, *overrides, "placement.pools.main.device_per_node=2")
    assert code == 1 and "did you mean 'placement.pools.main.devices_per_node'" in err


def test_prepare_raises_typed_errors(tmp_path):
    with pytest.raises(GraphFileError):
        prepare(str(tmp_path / "missing.py"))
    path = write_graph(tmp_path, "def build(cfg): ...\n")
    with pytest.raises(ConfigError):
        prepare(path, ["trainer.stepz=1"])
