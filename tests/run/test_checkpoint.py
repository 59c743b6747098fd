"""Checkpoints are atomic, complete, retained, and loaded without unpickling."""
import json
import os

import pytest
import torch

from hybridflow.run.checkpoint import (CheckpointError, latest_checkpoint, load_trainer_state,
                                       save_checkpoint)


def _save_roles(root):
    os.makedirs(f"{root}/actor")
    torch.save({"w": torch.ones(3)}, f"{root}/actor/optim_rank0.pt")


def test_interrupted_write_leaves_previous_checkpoint_loadable(tmp_path):
    root = str(tmp_path / "ckpt")
    first = save_checkpoint(root, 1, _save_roles, {"loader": {"epoch": 0, "cursor": 4}})

    def crash(path):
        _save_roles(path)
        raise KeyboardInterrupt("killed mid-write")

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(root, 2, crash, {"loader": {}})
    assert latest_checkpoint(root) == first
    state, rng = load_trainer_state(first)
    assert state["step"] == 1 and state["loader"]["cursor"] == 4
    assert rng.dtype == torch.uint8


def test_retention_keeps_the_newest(tmp_path):
    root = str(tmp_path)
    for step in range(1, 5):
        save_checkpoint(root, step, _save_roles, {}, keep=2)
    kept = sorted(n for n in os.listdir(root) if n.startswith("step_"))
    assert kept == ["step_000003", "step_000004"]


def test_damaged_checkpoint_is_refused(tmp_path):
    path = save_checkpoint(str(tmp_path), 1, _save_roles, {})
    with open(os.path.join(path, "actor", "optim_rank0.pt"), "ab") as fh:
        fh.write(b"junk")
    with pytest.raises(CheckpointError, match="optim_rank0.pt"):
        load_trainer_state(path)


def test_manifest_lists_every_file_but_itself(tmp_path):
    path = save_checkpoint(str(tmp_path), 7, _save_roles, {})
    files = json.load(open(os.path.join(path, "manifest.json")))["files"]
    assert "manifest.json" not in files
    assert {"trainer_state.json", "rng_torch.safetensors", "actor/optim_rank0.pt"} <= set(files)


def test_a_file_damaged_in_place_is_refused_naming_it(tmp_path):
    """Same size, different bytes (bit rot, a bad copy): the sha256 in the manifest
    catches what a size check cannot."""
    path = save_checkpoint(str(tmp_path), 1, _save_roles, {})
    target = os.path.join(path, "actor", "optim_rank0.pt")
    data = bytearray(open(target, "rb").read())
    data[-10] ^= 0xFF
    with open(target, "wb") as fh:
        fh.write(bytes(data))
    with pytest.raises(CheckpointError, match=r"actor/optim_rank0.pt does not match its sha256"):
        load_trainer_state(path)


def test_manifest_records_a_sha256_for_every_file(tmp_path):
    path = save_checkpoint(str(tmp_path), 2, _save_roles, {})
    manifest = json.load(open(os.path.join(path, "manifest.json")))
    assert set(manifest["sha256"]) == set(manifest["files"])
    assert all(len(h) == 64 for h in manifest["sha256"].values())


def test_a_checkpoint_without_digests_still_loads_on_sizes(tmp_path):
    """Checkpoints written before digests were recorded are checked on sizes."""
    path = save_checkpoint(str(tmp_path), 3, _save_roles, {})
    manifest_path = os.path.join(path, "manifest.json")
    manifest = json.load(open(manifest_path))
    del manifest["sha256"]
    json.dump(manifest, open(manifest_path, "w"))
    state, _ = load_trainer_state(path)
    assert state["step"] == 3


def test_a_failed_write_leaves_no_temporary_directory(tmp_path):
    """A full disk mid-save: the error propagates, the partial directory is removed,
    and the previous checkpoint stays the latest."""
    import errno
    root = str(tmp_path)
    first = save_checkpoint(root, 1, _save_roles, {})

    def disk_full(path):
        _save_roles(path)
        raise OSError(errno.ENOSPC, "No space left on device", f"{path}/actor/model.safetensors")

    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(root, 2, disk_full, {})
    assert sorted(os.listdir(root)) == ["step_000001"]
    assert latest_checkpoint(root) == first


def test_a_damaged_shard_of_a_sharded_checkpoint_is_named(tmp_path):
    """A trained role's checkpoint is one DCP file per rank: each is in the manifest
    with its sha256, so a changed shard is refused by name before anything loads."""
    from tests.support.workers import make_cfg
    from hybridflow.workers import ActorWorker
    actor = ActorWorker(make_cfg())
    path = save_checkpoint(str(tmp_path), 1,
                           lambda root: actor.save_checkpoint(os.path.join(root, "actor")), {})
    files = json.load(open(os.path.join(path, "manifest.json")))["sha256"]
    assert {"actor/dcp/.metadata", "actor/dcp/__0_0.distcp", "actor/scheduler.pt"} <= set(files)
    shard = os.path.join(path, "actor", "dcp", "__0_0.distcp")
    data = bytearray(open(shard, "rb").read())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    open(shard, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match=r"actor/dcp/__0_0.distcp does not match its sha256"):
        load_trainer_state(path)


def test_the_newest_checkpoint_is_verified_and_never_passed_over(tmp_path):
    """A resume takes the newest step_* directory; one that is damaged or partial is
    refused by name, with the one before it named as what deleting it gives."""
    from hybridflow.run.checkpoint import newest_verified
    root = str(tmp_path)
    assert newest_verified(root) is None  # no folder: nothing saved
    first = save_checkpoint(root, 1, _save_roles, {}, keep=0)
    assert newest_verified(root) == first
    os.makedirs(os.path.join(root, "step_000002", "actor"))  # a partial copy
    with pytest.raises(CheckpointError, match=r"step_000002 is damaged: it has no manifest"
                                              r".json .*; delete .*step_000002 to resume "
                                              r"from step_000001"):
        newest_verified(root)


def test_the_only_checkpoint_damaged_says_there_is_none_before_it(tmp_path):
    from hybridflow.run.checkpoint import newest_verified
    path = save_checkpoint(str(tmp_path), 2, _save_roles, {})
    manifest = os.path.join(path, "manifest.json")
    record = json.load(open(manifest))
    record["step"] = 5
    json.dump(record, open(manifest, "w"))
    with pytest.raises(CheckpointError, match=r"manifest.json is of step 5, not 2; it is the "
                                              r"run's only checkpoint"):
        newest_verified(str(tmp_path))


def test_retention_and_a_re_save_leave_only_complete_step_directories(tmp_path):
    """A checkpoint being deleted leaves the step_* names first (.old-step_*), so a
    delete cut short never leaves a partial step_* directory for a resume to refuse."""
    root = str(tmp_path)
    for step in (1, 2, 3, 3):  # the last: the final save of a step already saved
        save_checkpoint(root, step, _save_roles, {}, keep=2)
    assert sorted(os.listdir(root)) == ["step_000002", "step_000003"]
    for name in os.listdir(root):
        assert os.path.exists(os.path.join(root, name, "manifest.json"))
