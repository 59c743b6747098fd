"""Nothing in a run directory's checkpoint runs code, through the commands a user types
(issue 36, class 1): a real 1-step run saves its checkpoint; a payload that would create
a marker file is planted in DCP's `.metadata`, in the optimizer's `lr` entry of a shard,
in a model tensor's entry, and in `scheduler.pt` (the manifest rewritten to agree, as
anyone who can write the checkpoint can do); then `hybridflow run --resume` (training,
and `trainer.val_only=true`) and `hybridflow export` are driven on it. The marker is
never created, the command fails, and its message names the file. On Ray, the same
refusal comes back from the worker. The worker-level sweep of every file is
tests/workers/test_checkpoint_payloads.py."""
from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import shutil

import pytest
import torch

from hybridflow.cli import main
from hybridflow.workers.parallel.safe_dcp import read_metadata
from tests.support.e2e import graph_file

SMALL = ("trainer.val_every=0", "data.batch_size=4", "rollout.n=2",
         "actor.mini_batch_size=8", "trainer.progress=false", "trainer.steps=1")


class Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def _torch_saved(marker: str) -> bytes:
    buffer = io.BytesIO()
    torch.save(Payload(marker), buffer)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    assert main(["run", graph_file("grpo"), f"trainer.runs_dir={runs}",
                 "trainer.run_name=run", *SMALL]) == 0
    return runs / "run"


def _remanifest(ckpt: str) -> None:
    """The manifest rewritten for the planted files, at its own step."""
    from hybridflow.run.checkpoint import file_sha256
    path = os.path.join(ckpt, "manifest.json")
    with open(path) as handle:
        record = json.load(handle)
    for rel in record["files"]:
        full = os.path.join(ckpt, rel)
        record["files"][rel], record["sha256"][rel] = os.path.getsize(full), file_sha256(full)
    with open(path, "w") as handle:
        json.dump(record, handle)


def _plant_metadata(role: str, marker: str) -> str:
    path = os.path.join(role, "dcp", ".metadata")
    with open(path, "wb") as handle:
        pickle.dump(Payload(marker), handle)
    return path


def _redirecting(key: str):
    def plant(role: str, marker: str) -> str:
        meta_path = os.path.join(role, "dcp", ".metadata")
        metadata = read_metadata(meta_path)
        shard = os.path.join(role, "dcp", "__0_0.distcp")
        payload, offset = _torch_saved(marker), os.path.getsize(shard)
        with open(shard, "ab") as handle:
            handle.write(payload)
        for index in [i for i in metadata.storage_data if i.fqn == key]:
            metadata.storage_data[index] = dataclasses.replace(
                metadata.storage_data[index], offset=offset, length=len(payload))
        with open(meta_path, "wb") as handle:
            pickle.dump(metadata, handle)
        return shard
    return plant


def _plant_schedule(role: str, marker: str) -> str:
    path = os.path.join(role, "scheduler.pt")
    with open(path, "wb") as handle:
        handle.write(_torch_saved(marker))
    return path


PLANTS = {"metadata": (_plant_metadata, True), "lr": (_redirecting("optim.param_groups.0.lr"),
                                                     False),
          "tensor": (_redirecting("model.model.embed_tokens.weight"), True),
          "schedule": (_plant_schedule, False)}


@pytest.mark.slow  # a 1-step run, then a resume, a validation and an export per payload
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_payload_runs_nowhere(capsys, finished, tmp_path, plant):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    ckpt = run_dir / "checkpoints" / "step_000001"
    marker = str(tmp_path / "ran")
    make, export_reads = PLANTS[plant]
    path = make(str(ckpt / "actor"), marker)
    _remanifest(str(ckpt))
    capsys.readouterr()
    args = [f"trainer.runs_dir={tmp_path}", "trainer.run_name=run", *SMALL]
    for mode in ([], ["trainer.val_only=true"]):
        code = main(["run", graph_file("grpo"), "--resume", str(run_dir), *args,
                     "trainer.steps=2", *mode])
        err = capsys.readouterr().err
        assert code != 0 and path in err and "refused" in err, err
        assert "weights_only=False" not in err and not os.path.exists(marker)
    code = main(["export", str(run_dir), str(tmp_path / "hf")])  # reads no trainer state
    err = capsys.readouterr().err
    if export_reads:  # the export reads the index and the weights, not the optimizer
        assert code != 0 and path in err and "refused" in err, err
    assert not os.path.exists(marker)


@pytest.mark.slow  # a Ray cluster starts for each resume
@pytest.mark.parametrize("plant", ["metadata", "lr"])
def test_a_planted_payload_runs_on_no_ray_worker(capsys, finished, tmp_path, plant):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    ckpt = run_dir / "checkpoints" / "step_000001"
    marker = str(tmp_path / "ran")
    path = PLANTS[plant][0](str(ckpt / "actor"), marker)
    _remanifest(str(ckpt))
    capsys.readouterr()
    code = main(["run", graph_file("grpo"), "--resume", str(run_dir),
                 f"trainer.runs_dir={tmp_path}", "trainer.run_name=run", *SMALL,
                 "trainer.steps=2", "runtime.name=ray"])
    err = capsys.readouterr().err
    assert code != 0 and path in err and "refused, nothing from it was run" in err, err
    assert not os.path.exists(marker)
