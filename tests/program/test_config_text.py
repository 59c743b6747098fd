"""Issue 36, item 4: a control character in configuration text is refused with one line
naming the source, the key and the character -- every kind of override (top-level
and nested keys, list values, a key of its own, --config file values and keys) with
several characters, never YAML's ReaderError."""
from __future__ import annotations

import pytest

from hybridflow.cli import main
from hybridflow.core.constraints import ConfigError
from hybridflow.program.config import build_config
from hybridflow.program.config_text import refused_character
from tests.support.recorded_runs import graph_path

GRPO = graph_path("grpo.py")
# ESC (a terminal escape), BEL, NUL, DEL, a C1 CSI, a bidi override, a line separator,
# and a newline and a tab (control characters on a command line)
CHARACTERS = ["\x1b", "\x07", "\x00", "\x7f", "\x9b", "\u202e", "\u2028", "\n", "\t"]
# (override with X where the character goes, the key the message names, key or value)
OVERRIDES = [
    ("trainer.run_name=aXb", "trainer.run_name", "value"),
    ("placement.pools.main.cores=[0X]", "placement.pools.main.cores", "value"),
    ("data.toy.max_operand=X9", "data.toy.max_operand", "value"),
    ("data.train_files=[a.jsonl,bX.jsonl]", "data.train_files", "value"),
    ("trainer.runX_name=x", "trainer.run\\x", "key"),
    ("workers.teXacher=m.py:T", "workers.te", "key"),
]


def _code(char: str) -> str:
    return f"U+{ord(char):04X}"


@pytest.mark.parametrize("char", CHARACTERS, ids=_code)
@pytest.mark.parametrize("override, key, part", OVERRIDES, ids=[o[0] for o in OVERRIDES])
def test_a_control_character_in_any_override_is_one_line_naming_key_and_character(
        override, key, part, char):
    with pytest.raises(ConfigError) as err:
        build_config(overrides=[override.replace("X", char)])
    message = str(err.value)
    assert message.startswith("override ") and key.split("\\")[0] in message, message
    assert f"control character {_code(char)} is not allowed in a config {part}" in message
    assert char not in message  # shown as its escape


@pytest.mark.parametrize("char", ["\x1b", "\x07", "\x7f", "\x9b", "\u202e", "\u2028"],
                         ids=_code)
@pytest.mark.parametrize("where", ["value", "list", "key"])
def test_a_control_character_in_a_config_file_names_the_file_and_key(tmp_path, char, where):
    escape = char.encode("unicode_escape").decode()  # YAML's double-quoted escapes
    escape = escape.replace("\\x1b", "\\e").replace("\\x07", "\\a")
    text = {"value": f'trainer:\n  run_name: "a{escape}b"\n',
            "list": f'data:\n  train_files: ["a", "b{escape}"]\n',
            "key": f'trainer:\n  "run{escape}": 1\n'}[where]
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        build_config(yaml_file=str(path))
    message = str(err.value)
    named = {"value": "key trainer.run_name", "list": "key data.train_files[1]",
             "key": "key trainer.run\\"}[where]
    assert message.startswith(f"{path}: {named}"), message
    assert f"control character {_code(char)}" in message and char not in message


def test_a_config_files_tabs_and_newlines_are_yamls_own(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text('algorithm:\n  note: "one\\ttwo\\nthree"\n')
    cfg = build_config(yaml_file=str(path))
    assert cfg.algorithm.note == "one\ttwo\nthree"
    assert refused_character("a\tb\nc", in_file=True) is None
    assert refused_character("a\tb") == "\t"


@pytest.mark.parametrize("command", ["check", "run"])
def test_the_command_line_says_it_in_one_line(capsys, tmp_path, command):
    code = main([command, GRPO, "trainer.run_name=x\x1b[2J", f"trainer.runs_dir={tmp_path}"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1
    assert lines == [f"hybridflow {command}: override trainer.run_name: control character "
                     f"U+001B is not allowed in a config value; remove it"]
    assert not list(tmp_path.iterdir())
