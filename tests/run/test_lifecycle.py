"""Resume validation (hybridflow/run/lifecycle.py): a saved config read back equals
itself for every shipped graph (a plain resume is never refused), a difference is
listed key by key, and keys set on purpose are allowed and said."""
from __future__ import annotations

import glob
import os

import pytest
from omegaconf import OmegaConf

from hybridflow.program.assemble import prepare
from hybridflow.run.lifecycle import (ResumeError, check_resumed_config, config_changes,
                                      explicit_keys)
from hybridflow.run.tracking import RunDir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRAPHS = sorted(p for p in glob.glob(os.path.join(REPO, "graphs", "*.py"))
                if "def build(" in open(p, encoding="utf-8").read())


@pytest.mark.parametrize("graph", GRAPHS, ids=os.path.basename)
def test_a_saved_config_reads_back_unchanged_for_every_graph(graph, tmp_path):
    loaded = prepare(graph, [f"trainer.runs_dir={tmp_path}"], preflight=False)
    run = RunDir(str(tmp_path / "run"))
    run.save_config(loaded.cfg)
    resumed = prepare(graph, [], run.file("config.yaml"), preflight=False)
    assert config_changes(OmegaConf.load(run.file("config.yaml")), resumed.cfg) == []


def test_changes_are_listed_key_by_key_and_allowed_when_asked(tmp_path):
    saved = OmegaConf.create({"trainer": {"steps": 4, "seed": 1}, "algorithm": {}})
    now = OmegaConf.create({"trainer": {"steps": 8, "seed": 2}, "algorithm": {"k": 1}})
    run = RunDir(str(tmp_path))
    with pytest.raises(ResumeError) as refused:
        check_resumed_config(run, saved, now, explicit_keys(["trainer.steps=8"], None))
    listed = str(refused.value).splitlines()[1:3]
    assert listed == ["  algorithm.k: '<unset>' (saved) -> 1", "  trainer.seed: 1 (saved) -> 2"]
    yaml = tmp_path / "more.yaml"
    yaml.write_text("trainer:\n  seed: 2\n")
    said = check_resumed_config(run, saved, now, explicit_keys(["trainer.steps=8", "algorithm.k=1"],
                                                                str(yaml)))
    assert said == ["changed on resume: algorithm.k: '<unset>' -> 1",
                    "changed on resume: trainer.seed: 1 -> 2",
                    "changed on resume: trainer.steps: 4 -> 8"]
