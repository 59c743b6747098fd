"""Failures inside DCP's reader and writer name the file (issue 36, class 2, the
checkpoint's part): a shard missing or cut short, an index missing, is one line naming
that file and what to do (never "another model, or LoRA", which is said only when the
keys really differ); a save that fails (a full disk: DCP's OSError, or torch's zip
writer cut short) is one line naming the directory and the cause, and the run's
checkpoint leaves nothing that looks complete. A real full disk (a 300 KB tmpfs in a
user namespace) is the slow case."""
import errno
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.workers import TINY, make_cfg, rollout_for_update
from hybridflow.core.loading import UserFileError
from hybridflow.run.checkpoint import latest_checkpoint, save_checkpoint
from hybridflow.workers import ActorWorker
from hybridflow.workers.parallel.sharded_checkpoint import CheckpointSaveError

CFG = make_cfg(actor={"lr": 1e-2})
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    actor = ActorWorker(CFG)
    actor.update(rollout_for_update(actor, n=1))
    actor.save_checkpoint(str(root / "actor"))
    return str(root / "actor")


def _damaged(saved: str, tmp_path, damage) -> tuple[str, str]:
    role = str(tmp_path / "actor")
    shutil.copytree(saved, role)
    return role, damage(role)


def _remove(rel):
    def damage(role):
        os.remove(os.path.join(role, rel))
        return os.path.join(role, rel)
    return damage


def _cut(rel, keep):
    def damage(role):
        os.truncate(os.path.join(role, rel), keep)
        return os.path.join(role, rel)
    return damage


@pytest.mark.parametrize("damage, says", [
    (_remove("dcp/__0_0.distcp"), "is missing"),
    (_cut("dcp/__0_0.distcp", 5000), "is truncated: 5000 bytes"),
    (_cut("dcp/__0_0.distcp", 0), "is truncated: 0 bytes"),
    (_remove("dcp/.metadata"), "is missing"),
    (_cut("dcp/.metadata", 100), "is not DCP metadata"),
    (_remove("scheduler.pt"), "no scheduler.pt"),
    (_cut("scheduler.pt", 10), "cannot be read"),
], ids=["shard-missing", "shard-cut", "shard-empty", "index-missing", "index-cut",
        "schedule-missing", "schedule-cut"])
def test_a_damaged_file_is_one_line_naming_it(saved, tmp_path, damage, says):
    role, path = _damaged(saved, tmp_path, damage)
    with pytest.raises((UserFileError, FileNotFoundError)) as err:
        ActorWorker(CFG).load_checkpoint(role)
    text = str(err.value)
    assert (path in text or os.path.basename(path) in text) and says in text, text
    assert "\n" not in text and "another model" not in text, text
    if "dcp" in path:  # the export reads the same files through the same door
        from hybridflow.workers.hf_export import write_checkpoint_weights
        with pytest.raises(UserFileError, match=says) as err:
            write_checkpoint_weights(role, str(tmp_path / "hf"), bucket_bytes=1 << 20)
        assert path in str(err.value) and "\n" not in str(err.value)


def test_another_model_is_still_said_to_be_another_model(saved):
    other = ActorWorker(make_cfg(model={"hf_config": {**TINY, "num_hidden_layers": 3}}))
    with pytest.raises(ValueError, match="does not fit this role's model") as err:
        other.load_checkpoint(saved)
    assert "\n" not in str(err.value) and "Traceback" not in str(err.value)


def _fail_writes(monkeypatch, exc):
    import torch.distributed.checkpoint.filesystem as fs

    def write_item(*args, **kwargs):
        raise exc
    monkeypatch.setattr(fs, "_write_item", write_item)


@pytest.mark.parametrize("exc, free, says", [
    (OSError(errno.ENOSPC, "No space left on device"), None,
     "OSError: No space left on device"),
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"),
     4096, "OSError: No space left on device (4096 bytes free there)"),
    (OSError(errno.EACCES, "Permission denied"), None, "OSError: Permission denied"),
], ids=["enospc", "zip-writer-cut", "eacces"])
def test_a_failed_save_is_one_line_and_leaves_no_checkpoint(tmp_path, monkeypatch, exc,
                                                            free, says):
    actor = ActorWorker(CFG)
    _fail_writes(monkeypatch, exc)
    if free is not None:
        usage = shutil.disk_usage(tmp_path)
        monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=free))
    root = str(tmp_path / "checkpoints")
    with pytest.raises(CheckpointSaveError) as err:
        save_checkpoint(root, 1, lambda d: actor.save_checkpoint(os.path.join(d, "actor")), {})
    text = str(err.value)
    assert says in text and "\n" not in text, text
    assert os.path.join(root, ".tmp-step_000001", "actor") in text
    assert latest_checkpoint(root) is None
    assert [n for n in os.listdir(root) if n.startswith(("step_", ".tmp-"))] == []


_FULL_DISK = """
import os, subprocess, sys
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", sys.argv[1]], check=True)
from tests.support.workers import make_cfg
from hybridflow.workers import ActorWorker
from hybridflow.workers.parallel.sharded_checkpoint import CheckpointSaveError
try:
    ActorWorker(make_cfg()).save_checkpoint(os.path.join(sys.argv[1], "actor"))
except CheckpointSaveError as err:
    print("REFUSED", err)
"""


@pytest.mark.slow  # a fresh interpreter builds a model (~10 s)
def test_a_save_onto_a_full_disk_names_the_directory_and_the_cause(tmp_path):
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no user namespaces here to mount a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run(["unshare", "-rm", sys.executable, "-c", _FULL_DISK, str(disk)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(lines) == 1, done.stdout + done.stderr
    assert f"could not save checkpoint '{disk}/actor'" in lines[0]
    assert "No space left on device" in lines[0]
