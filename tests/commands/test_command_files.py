"""Issue 32, class 3: the load boundary for every command's files.

Every file a command reads (a GGUF file, a graph, a `--config`, a run directory, a
model config, a device entry) as random bytes, empty, a directory, missing or
unreadable ends in one line naming the file, exit code != 0, no traceback; every
path a command writes (`--out`, `-o`, `--save`, `--render`) is checked before the
work starts: a file where a directory goes, a path under a file, the input itself."""
from __future__ import annotations

import os
import shutil

import pytest

from tests.support.cli_run import message_lines, run_cli
from tests.support.corrupt import corrupt
from tests.support.recorded_runs import REPO, fabricate_run, graph_path

GRPO = graph_path("grpo.py")
TOY = os.path.join(REPO, "graphs", "assets", "toy_base")
DAMAGES = ("random", "empty", "directory", "missing", "unreadable")


def _gguf(tmp):
    path = tmp / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path, ["model", "gguf", path, "--out", tmp / "out"]


def _config(command):
    def setup(tmp):
        path = tmp / "c.yaml"
        path.write_text("trainer:\n  steps: 2\n")
        extra = {"render": ["-o", tmp / "g.svg"]}.get(command, [])
        return path, [command, GRPO, "--config", path, *extra]
    return setup


def _graph(command):
    def setup(tmp):
        path = tmp / "g.py"
        shutil.copy(GRPO, path)
        extra = {"render": ["-o", tmp / "g.svg"]}.get(command, [])
        return path, [command, path, *extra]
    return setup


def _run_dir(command):
    def setup(tmp):
        folder = fabricate_run(tmp / "run")
        argv = {"status": ["status", folder],
                "export": ["export", folder, tmp / "out"],
                "calibrate": ["plan", "--calibrate", folder, "--device", "cpu"],
                "timeline": ["render", "--timeline", folder, "-o", tmp / "t.svg"],
                "resume": ["run", GRPO, "--resume", folder, "trainer.progress=false"]}[command]
        return tmp / "run", argv
    return setup


def _plan_model(tmp):
    folder = tmp / "model"
    shutil.copytree(TOY, folder)
    return folder / "config.json", ["plan", GRPO, "--model", folder / "config.json"]


READERS = {
    "model gguf FILE": _gguf,
    "check --config": _config("check"), "run --config": _config("run"),
    "render --config": _config("render"), "plan --config": _config("plan"),
    "check GRAPH": _graph("check"), "render GRAPH": _graph("render"),
    "plan GRAPH": _graph("plan"), "run GRAPH": _graph("run"),
    "status RUN_DIR": _run_dir("status"), "export RUN_DIR": _run_dir("export"),
    "plan --calibrate RUN_DIR": _run_dir("calibrate"),
    "render --timeline RUN_DIR": _run_dir("timeline"),
    "run --resume RUN_DIR": _run_dir("resume"),
    "plan --model config.json": _plan_model,
}
# a run directory given as random bytes / empty is a file where a directory belongs
CASES = [pytest.param(name, how, id=f"{name}-{how}") for name in READERS for how in DAMAGES]


def _damage(path, how: str, monkeypatch) -> None:
    if how != "unreadable":
        valid = path.read_bytes() if path.is_file() else b""
        if path.is_dir():
            shutil.rmtree(path)
            path.write_bytes(b"")  # so corrupt() has a file to replace
        corrupt(str(path), how, valid)
        return
    real_access = os.access  # this suite runs as root, which reads anything: the
    # boundary's permission check is what is under test

    def access(target, mode, *args, **kwargs):
        if os.path.abspath(str(target)) == os.path.abspath(str(path)) and mode & os.R_OK:
            return False
        return real_access(target, mode, *args, **kwargs)
    monkeypatch.setattr(os, "access", access)


@pytest.mark.parametrize("name,how", CASES)
def test_every_file_a_command_reads_fails_in_one_line_naming_it(name, how, tmp_path, capsys,
                                                                monkeypatch):
    path, argv = READERS[name](tmp_path)
    _damage(path, how, monkeypatch)
    code, err = run_cli(argv, capsys)
    if how == "unreadable" and name.endswith("RUN_DIR"):
        return  # a directory's permission is not a file's: covered by its files' sweep
    lines = message_lines(err)
    assert code != 0, f"{name} accepted a {how} file: {err}"
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith(f"hybridflow {argv[0]}: "), err
    assert path.name in lines[0], lines[0]
    if how == "directory" and not name.endswith("RUN_DIR"):  # an empty run dir lacks files
        assert "does not exist" not in lines[0], lines[0]


def test_a_gguf_whose_tokenizer_has_no_scores_is_one_line(tmp_path, capsys):
    """The issue's case: a valid GGUF that transformers fails on (KeyError: 'scores',
    46 lines from deep in its converter)."""
    gguf = pytest.importorskip("gguf")
    import numpy as np
    path = tmp_path / "noscores.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((writer.add_block_count, 1), (writer.add_context_length, 64),
                       (writer.add_embedding_length, 8), (writer.add_feed_forward_length, 16),
                       (writer.add_head_count, 2), (writer.add_head_count_kv, 2),
                       (writer.add_layer_norm_rms_eps, 1e-5), (writer.add_tokenizer_model,
                                                               "llama")):
        add(value)
    writer.add_token_list(["<s>", "</s>", "a", "b"])
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    code, err = run_cli(["model", "gguf", path, "--out", tmp_path / "out"], capsys)
    lines = message_lines(err)
    assert code == 1 and "Traceback" not in err and len(lines) == 1, err
    assert str(path) in lines[0] and "scores" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_random_bytes_named_gguf_is_refused_by_its_magic(tmp_path, capsys):
    path = tmp_path / "r.gguf"
    path.write_bytes(os.urandom(300).replace(b"GGUF", b"xxxx"))
    code, err = run_cli(["model", "gguf", path, "--out", tmp_path / "out"], capsys)
    assert code == 1 and "is not a GGUF file" in err and str(path) in err, err


# ---- outputs: checked before the work ----

def _file(tmp):
    path = tmp / "taken"
    path.write_text("x")
    return path


WRITERS = {  # name -> (argv for an output path, the kind of output, reads an input)
    "data --out": (lambda tmp, out: ["data", "toy", "--out", out], "directory", False),
    "model --out": (lambda tmp, out: ["model", "gguf", _gguf(tmp)[0], "--out", out],
                    "directory", True),
    "render -o": (lambda tmp, out: ["render", tmp / "g.py", "-o", out], "file", True),
    "plan --save": (lambda tmp, out: ["plan", tmp / "g.py", "--save", out], "file", True),
    "plan --render": (lambda tmp, out: ["plan", tmp / "g.py", "--render", out], "file", True),
    "plan --measure-device --save": (lambda tmp, out: ["plan", "--measure-device", "--save",
                                                       out], "file", False),
}
PLACES = ("a file where a directory goes", "a directory where a file goes", "under a file",
          "the input")
OUT_CASES = [pytest.param(name, place, id=f"{name}-{place}") for name in WRITERS
             for place in PLACES]


def _place(tmp, name: str, place: str, kind: str):
    if place == "under a file":
        return _file(tmp) / "sub" / "x"
    if place == "the input":  # a copy: a check that failed must not overwrite the repo's
        return {"model --out": tmp / "m.gguf"}.get(name, tmp / "g.py")
    if kind == "directory" and place == "a file where a directory goes":
        return _file(tmp)
    if kind == "file" and place == "a directory where a file goes":
        return tmp
    return None  # a place that is fine for this kind of output


@pytest.mark.parametrize("name,place", OUT_CASES)
def test_every_output_path_is_checked_before_the_work(name, place, tmp_path, capsys):
    make_argv, kind, reads = WRITERS[name]
    shutil.copy(GRPO, tmp_path / "g.py")
    out = _place(tmp_path, name, place, kind)
    if out is None or (place == "the input" and not reads):
        return  # a fine place for this output, or a command that reads no input
    before = (tmp_path / "g.py").read_bytes()
    code, err = run_cli(make_argv(tmp_path, out), capsys)
    lines = message_lines(err)
    assert code != 0 and "Traceback" not in err, err
    assert len(lines) == 1 and str(out) in lines[0], err
    assert (tmp_path / "g.py").read_bytes() == before  # the input is never written
