"""Issue 32, class 2: untrusted text never reaches the terminal raw.

A run directory, a model's output, a data row, a config key and a user function's
exception text are data. Every path that prints -- the commands' output and errors,
status, run messages, the progress bar, generations shown, warnings, TensorBoard
text -- goes through `hybridflow.core.printable`; files keep the exact text. The sweep
sends the whole C0/C1 control set (plus DEL and the bidi overrides) down each path,
and a source sweep holds that no other way to print exists in the package."""
from __future__ import annotations

import ast
import json
import os
import sys
import warnings

import pytest

from hybridflow.cli import main
from hybridflow.core.printable import MISUSED, echo, printable, sanitize_warnings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the case (clear screen, window title, colour, an OSC 8 hyperlink) and every
# character that can drive a terminal or reorder what it shows
ATTACK = ("\x1b[2J\x1b]0;pwned\x07\x1b[31mred\x1b]8;;http://evil.example\x1b\\link"
          "\x1b]8;;\x1b\\" + MISUSED + "\u202eevil")


def assert_clean(text: str) -> None:
    raw = sorted({f"U+{ord(c):04X}" for c in text if c in MISUSED})
    assert not raw, f"raw control characters reached the console: {raw}"


def test_printable_escapes_every_control_and_keeps_text():
    shown = printable(ATTACK + "\tcafé 中文\nnext")
    assert_clean(shown)
    assert "\\x1b[2J" in shown and "\\x9b" in shown and "\\u202e" in shown
    assert "\tcafé 中文\nnext" in shown  # tabs, newlines and ordinary text stay
    assert len(MISUSED) == 30 + 1 + 32 + 12 + 3  # C0 but \t \n, DEL, C1, bidi, separators


def test_status_prints_a_reason_with_escape_sequences_escaped(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("trainer: {}\n")
    (tmp_path / "status.json").write_text(json.dumps(
        {"state": "failed", "step": 2, "steps": 4, "time": 0.0, "reason": ATTACK}))
    assert main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert_clean(out)
    assert "\\x1b]8;;http://evil.example" in out  # shown, visibly, not followed


def test_a_run_directory_named_with_controls_is_shown_escaped(tmp_path, capsys):
    folder = tmp_path / "run\x1b[2J"
    folder.mkdir()
    assert main(["status", str(folder)]) == 1
    assert_clean(capsys.readouterr().err)


def test_an_error_message_quoting_user_text_is_escaped(capsys):
    from hybridflow.commands.errors import report
    from hybridflow.core.constraints import ConfigError
    assert report("check", ConfigError(f"bad value {ATTACK}")) == 1
    assert_clean(capsys.readouterr().err)


def test_argparse_messages_quoting_the_command_line_are_escaped(capsys):
    for argv in (["status", "a", ATTACK], [ATTACK], ["data", "toy", "--n-train", ATTACK]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        assert_clean(capsys.readouterr().err)


def test_an_unknown_config_key_with_controls_is_escaped(capsys):
    code = main(["check", os.path.join(REPO, "graphs", "grpo.py"), f"trainer.{ATTACK}=1"])
    err = capsys.readouterr().err
    # refused before the key is looked up: a key with control characters is no key
    assert code == 1 and "control character U+001B is not allowed in a config key" in err
    assert_clean(err)


def test_a_user_exception_in_a_graph_file_is_escaped(tmp_path, capsys):
    graph = tmp_path / "g.py"
    graph.write_text(f"def build(cfg):\n    raise ValueError({ATTACK!r})\n")
    assert main(["check", str(graph)]) == 1
    err = capsys.readouterr().err
    assert "ValueError" in err
    assert_clean(err)


def test_a_failed_run_message_is_escaped_and_status_keeps_the_exact_text(tmp_path, capsys):
    from hybridflow.commands.run import _failed, _say
    from hybridflow.run.tracking import RunDir
    run_dir = RunDir(str(tmp_path / "run"), create=True)
    assert _failed(run_dir, "stopped at step 1", ValueError(ATTACK), step=1) == 1
    _say(f"note: {ATTACK}")
    assert_clean(capsys.readouterr().err)
    saved = json.loads((tmp_path / "run" / "status.json").read_text())
    # the file keeps what happened as the cause's one line (core/failure_text.cause_line):
    # its text, without the terminal's colour and control sequences, JSON-escaped
    assert "redlink" in saved["reason"] and "\x1b" not in saved["reason"]


def test_generations_shown_and_sent_to_tensorboard_are_escaped(tmp_path):
    from hybridflow.run.generations import GenerationLog
    shown, panels = [], []

    class Board:
        def add_text(self, tag, text, step):
            panels.append(tag + text)

    sinks = type("Sinks", (), {"tb": Board(), "wb": None})()
    log = GenerationLog(str(tmp_path / "g.jsonl"), tokenizer=None, sinks=sinks,
                        echo=shown.append)
    sample = {"step": 1, "split": "val", "prompt": ATTACK, "response": ATTACK, "score": 0.0,
              "ground_truth": ATTACK, "data_source": ATTACK}
    log.write([sample], show=True)
    assert shown and panels
    for text in (*shown, *panels):
        assert_clean(text)
    kept = json.loads((tmp_path / "g.jsonl").read_text())
    assert kept["response"] == ATTACK  # the file keeps the exact text


def test_the_progress_bar_escapes_metric_names(capsys):
    from hybridflow.commands.run import _Progress
    bar = _Progress(total=2, start=0, enabled=True)
    bar.update(1, {f"val/{ATTACK}/mean": 0.5, "reward/mean": 1.0})
    bar.close()
    err = capsys.readouterr().err
    assert "\\u202eevil" in err
    assert_clean(err.replace("\r", ""))  # tqdm's own carriage returns redraw the bar


def test_warnings_and_signal_notes_are_escaped(capsys):
    from hybridflow.run.signals import SignalGuard
    sanitize_warnings()
    shown = warnings.formatwarning(UserWarning(ATTACK), UserWarning, "f.py", 1)
    assert "UserWarning" in shown
    assert_clean(shown)
    SignalGuard().say(ATTACK)
    echo(ATTACK, file=sys.stderr)
    assert_clean(capsys.readouterr().err)


# ---- the source sweep: no way to reach a console but through printable ----

_ALLOWED = {  # (file, call): why it is safe
    ("core/printable.py", "print"): "echo itself",
    ("run/generations.py", "tqdm.write"): "writes format_samples, which is printable",
    ("run/generations.py", "add_text"): "a table of _cell, which is printable",
    ("commands/run.py", "set_postfix"): "keys through printable, values formatted floats",
    ("commands/run.py", "tqdm.write"): "the watch's warning, through printable",
}
_WATCHED = {"print", "write", "add_text", "set_postfix", "set_description", "warn_explicit"}


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "print":
                yield "print", node.lineno
            elif isinstance(func, ast.Attribute) and func.attr in _WATCHED - {"print"}:
                owner = ast.unparse(func.value)
                if func.attr == "write" and owner not in ("sys.stdout", "sys.stderr", "tqdm"):
                    continue  # a file's write: files keep the exact text
                yield ("tqdm.write" if owner == "tqdm" else func.attr), node.lineno


def test_every_console_write_in_the_package_goes_through_printable():
    found = []
    root = os.path.join(REPO, "hybridflow")
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            tree = ast.parse(open(path, encoding="utf-8").read())
            found += [f"{rel}:{line} {call}" for call, line in _calls(tree)
                      if (rel, call) not in _ALLOWED]
    assert not found, ("print through hybridflow.core.printable.echo (or printable()): "
                       + ", ".join(found))


@pytest.mark.parametrize("char", list(MISUSED))
def test_each_control_character_is_shown_as_its_escape(char):
    shown = printable(f"a{char}b")
    assert char not in shown and shown.startswith("a\\") and shown.endswith("b")
