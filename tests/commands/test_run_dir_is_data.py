"""Issue 26, class 7: a run directory is data, never code. The commands that read one
(`status`, `render --timeline`, `plan --calibrate`, `export`) work from its records and
import nothing it names: here every name a run directory holds (the graph file in
graph.json, worker, scorer and environment files in config.yaml) points at a file that
leaves a marker when imported, and no command may leave it. `export --role` refuses
every name that leaves the checkpoint."""
from __future__ import annotations

import json
import os

import pytest
from omegaconf import OmegaConf

from hybridflow.cli import main
from tests.support.recorded_runs import fabricate_run

ASYNC = ("trainer:\n  steps: 3\n  val_every: 0\n  staleness: 1\n"
         "  allow_uncorrected_async: true\n")
EVIL = "import pathlib\npathlib.Path({marker!r}).write_text('imported')\n{body}"
PLANTS = {  # where a run directory names code -> what the planted file defines
    "graph.json": "def build(cfg):\n    raise SystemExit('built')\n",
    "workers.judge": "class Judge:\n    pass\n",
    "reward.function_path": "def compute_score(**kw):\n    return 0.0\n",
    "rollout.backend": "def factory(spec):\n    return None\n",
}


def planted_run(tmp_path, yaml_text: str):
    folder = fabricate_run(tmp_path / "run", yaml_text=yaml_text)
    marker = tmp_path / "imported"
    files = {}
    for where, body in PLANTS.items():
        path = tmp_path / f"evil_{where.replace('.', '_')}.py"
        path.write_text(EVIL.format(marker=str(marker), body=body))
        files[where] = str(path)
    graph = json.loads(open(os.path.join(folder, "graph.json")).read())
    graph["file"] = files["graph.json"]
    with open(os.path.join(folder, "graph.json"), "w") as handle:
        json.dump(graph, handle)
    cfg = OmegaConf.load(os.path.join(folder, "config.yaml"))
    cfg.workers = {"judge": f"{files['workers.judge']}:Judge"}
    cfg.reward.function_path = files["reward.function_path"]
    cfg.rollout.backend = f"{files['rollout.backend']}:factory"
    OmegaConf.save(cfg, os.path.join(folder, "config.yaml"))
    return folder, marker


COMMANDS = {
    "status": ["status", "{run}"],
    "render --timeline": ["render", "--timeline", "{run}", "-o", "{tmp}/t.svg"],
    "render --timeline --steps": ["render", "--timeline", "{run}", "-o", "{tmp}/t.svg",
                                  "--steps", "1-3"],
    "plan --calibrate": ["plan", "--calibrate", "{run}", "--device", "cpu"],
    "plan --calibrate --save": ["plan", "--calibrate", "{run}", "--device", "cpu", "--save",
                                "{tmp}/fit.json"],
    "export": ["export", "{run}", "{tmp}/out"],
}


@pytest.mark.parametrize("yaml_text", [ASYNC, "trainer: {steps: 3, val_every: 0}\n"],
                         ids=["async run", "sync run"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_reading_a_run_directory_imports_nothing_it_names(command, yaml_text, tmp_path,
                                                          capsys):
    folder, marker = planted_run(tmp_path, yaml_text)
    argv = [a.format(run=folder, tmp=tmp_path) for a in COMMANDS[command]]
    code = main(argv)
    err = capsys.readouterr().err
    assert not marker.exists(), f"{command} imported a file the run directory names"
    assert code == 0, err
    assert "not marked" not in err  # an async run's sides come from plan.json


def test_an_async_runs_timeline_is_marked_from_its_records(tmp_path, capsys):
    folder, marker = planted_run(tmp_path, ASYNC)
    assert main(["render", "--timeline", folder, "-o", str(tmp_path / "t.svg")]) == 0
    assert 'data-side="rollout"' in (tmp_path / "t.svg").read_text()
    assert not marker.exists()


OUTSIDE = ["..", "../..", "../../..", "../../../..", ".", "/", "/etc", "actor/..",
           "actor/../..", "../run/checkpoints", "a/b", "actor/", "actor\x00", ""]


@pytest.mark.parametrize("role", OUTSIDE)
def test_export_refuses_a_role_that_leaves_the_checkpoint(role, tmp_path, capsys):
    folder = fabricate_run(tmp_path / "run")
    out = tmp_path / "out"
    code = main(["export", folder, str(out), "--role", role])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "not a role name" in lines[0], lines
    assert not out.exists()


def test_export_refuses_a_role_directory_linked_outside(tmp_path, capsys):
    folder = fabricate_run(tmp_path / "run")
    ckpt = os.path.join(folder, "checkpoints", "step_000003")
    os.symlink(str(tmp_path), os.path.join(ckpt, "stolen"))
    code = main(["export", folder, str(tmp_path / "out"), "--role", "stolen"])
    assert code == 1 and "outside the checkpoint" in capsys.readouterr().err
    assert main(["export", folder, str(tmp_path / "out2")]) == 0  # the real role exports
    assert os.path.isfile(tmp_path / "out2" / "model.safetensors")
