"""`hybridflow export` leaves a whole model directory or nothing: it writes into a
hidden sibling of OUT and renames it at the end; an export that fails, or finds no
weights to write, exits 1 with one line and leaves no OUT and no sibling."""
from __future__ import annotations

import errno
import os
import shutil

import pytest

from hybridflow.cli import main
from hybridflow.commands.export import ExportIntoExistingWarning


def _fake_run(tmp_path, files=("model.safetensors", "config.json", "tokenizer.json")) -> str:
    """A run directory with one checkpoint of role 'actor' holding `files` (its
    manifest agrees with them: only the files are missing or broken)."""
    from hybridflow.run.checkpoint import save_checkpoint

    def save_roles(root):
        for name in files:
            os.makedirs(os.path.dirname(f"{root}/actor/{name}"), exist_ok=True)
            open(f"{root}/actor/{name}", "w").write(name)

    run = tmp_path / "run"
    save_checkpoint(str(run / "checkpoints"), 2, save_roles, {})
    return str(run)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _left(folder) -> list[str]:
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


@pytest.mark.parametrize("files", [
    ("config.json", "tokenizer.json"),                             # no weights at all
    ("config.json", "tokenizer.json", "dcp/__0_0.distcp"),         # dcp/.metadata missing
], ids=["no-weights", "no-dcp-metadata"])
def test_a_checkpoint_without_weights_exits_1_and_writes_nothing(capsys, tmp_path, files):
    run = _fake_run(tmp_path, files)
    out = tmp_path / "exports" / "hf"
    assert main(["export", run, str(out)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("hybridflow export: ") and "actor" in line
    assert not (tmp_path / "exports").exists()  # nor the parent folder made for it


def test_a_write_that_fails_midway_leaves_no_half_output(capsys, tmp_path, monkeypatch):
    run = _fake_run(tmp_path)
    copy = shutil.copy2

    def copy_until_full(src, dst, *args, **kwargs):
        if os.path.basename(src) == "tokenizer.json":  # after others were written
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), dst)
        return copy(src, dst, *args, **kwargs)
    monkeypatch.setattr(shutil, "copy2", copy_until_full)
    out = tmp_path / "hf"
    assert main(["export", run, str(out)]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "No space left on device" in line and "tokenizer.json" in line
    assert _left(tmp_path) == ["run"]


def test_an_empty_out_is_filled_and_a_full_one_is_deprecated(capsys, tmp_path):
    run = _fake_run(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export", run, str(empty)]) == 0
    assert _left(empty) == ["config.json", "model.safetensors", "tokenizer.json"]
    full = tmp_path / "full"
    full.mkdir()
    (full / "README.md").write_text("mine")
    with pytest.warns(ExportIntoExistingWarning, match="already holds files"):
        assert main(["export", run, str(full)]) == 0
    assert _left(full) == ["README.md", "config.json", "model.safetensors", "tokenizer.json"]
    assert [n for n in _left(tmp_path) if n.startswith(".")] == []


def test_a_library_base_exception_while_reading_is_one_line(capsys, tmp_path, monkeypatch):
    """torch's DCP raises CheckpointException, a BaseException: still one line (its
    root cause), exit 1, nothing written."""
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

    import hybridflow.workers.hf_export as hf_export

    def dcp_fails(role_dir, *args, **kwargs):
        try:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT),
                                    f"{role_dir}/dcp/__1_0.distcp")
        except FileNotFoundError as err:
            raise CheckpointException("load", {0: _wrap_exception(err)}) from None
    monkeypatch.setattr(hf_export, "write_checkpoint_weights", dcp_fails)
    monkeypatch.setattr("hybridflow.commands.export._needs_rewrite", lambda *a: True)
    run = _fake_run(tmp_path)
    assert main(["export", run, str(tmp_path / "hf")]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("hybridflow export: FileNotFoundError: No such file or directory: ")
    assert line.endswith("actor/dcp/__1_0.distcp")
    assert _left(tmp_path) == ["run"]
