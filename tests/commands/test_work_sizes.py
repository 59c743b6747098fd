"""Issue 32, class 4: arguments that size work are checked before the work.

Every number a command option takes declares its range (`commands/args.count` /
`number`): the sweep walks every command's parser, so a new numeric option without a
range fails here; past either end it is an argparse error naming the option. Every
data generator knows its problem space from its arguments and refuses, before making
a row, what it cannot make, naming the largest value it can."""
from __future__ import annotations

import argparse

import pytest

from hybridflow.cli import build_parser
from tests.support.cli_run import message_lines, run_cli


def _options():
    parser, _ = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command, child in sub.choices.items():
        for action in child._actions:
            if action.option_strings and action.type is not None:
                yield command, action


NUMERIC = [(c, a) for c, a in _options() if a.type in (int, float)
           or hasattr(a.type, "bounds")]


def test_every_numeric_option_declares_its_range():
    unbounded = [f"{c} {a.option_strings[-1]}" for c, a in NUMERIC
                 if not hasattr(a.type, "bounds")]
    assert not unbounded, f"give these a range (commands/args.count/number): {unbounded}"
    assert len(NUMERIC) >= 20  # plan's cluster and workload, data's sizes, render's step


@pytest.mark.parametrize("command,action", [pytest.param(c, a, id=f"{c} {a.option_strings[-1]}")
                                            for c, a in NUMERIC])
def test_a_value_past_either_end_is_refused_naming_the_option(command, action, capsys):
    low, high = action.type.bounds
    flag = action.option_strings[-1]
    odd = "nan" if action.type.__name__ == "number" else "1.5"
    for value in (low - 1, high * 10 + 1, odd):
        with pytest.raises(SystemExit) as stop:
            build_parser()[0].parse_args([command, *(["toy"] if command == "data" else []),
                                          flag, str(value)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and f"argument {flag}" in err, (value, err)


# every generator and each argument that sizes its work: a value it cannot make
GENERATORS = [
    ("word_arith --n-train", ["data", "word_arith", "--n-train", "100000000"], "11,440"),
    ("word_arith --n-test", ["data", "word_arith", "--n-test", "5000"], "1,243"),
    ("word_arith --max-number", ["data", "word_arith", "--max-number", "100000"], "577"),
    ("toy --max-operand", ["data", "toy", "--max-operand", "100000"], "999"),
]


@pytest.mark.parametrize("name,argv,largest", [pytest.param(*g, id=g[0]) for g in GENERATORS])
def test_a_generator_refuses_what_it_cannot_make_naming_the_largest(name, argv, largest,
                                                                    tmp_path, capsys):
    code, err = run_cli([*argv, "--out", tmp_path / "d"], capsys, seconds=30)
    lines = message_lines(err)
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert "at most" in lines[0] and largest in lines[0], lines[0]
    assert not (tmp_path / "d").exists()  # refused before a row was made


def test_the_generators_know_their_problem_space():
    from algorithms.rewards import toy, word_arith
    for m in (3, 9, 20, 40):
        assert word_arith.problem_count(m) == len(word_arith.all_problems(m))
    top = word_arith.largest_max_number()
    assert word_arith.problem_count(top) <= word_arith.MAX_PROBLEMS
    assert word_arith.problem_count(top + 1) > word_arith.MAX_PROBLEMS
    assert (toy.MAX_OPERAND + 1) ** 2 <= toy.MAX_PAIRS < (toy.MAX_OPERAND + 2) ** 2
    train, _ = word_arith.train_test_rows(1, 11_440, 100, 20)  # the largest it makes
    assert len(train) == 11_440 and len({tuple(r["extra_info"]["problem"])
                                         for r in train}) == 1_144


def test_a_toy_config_beyond_the_problem_space_is_a_data_error():
    from hybridflow.core.data import DataError, toy_rows
    with pytest.raises(DataError, match="at most max_operand=999"):
        toy_rows(1, 10 ** 6, 0.25)


def test_long_work_shows_progress(tmp_path, capsys):
    from hybridflow.commands import data
    data._BAR_ROWS = 1  # a bar from the first row (drawn after its one-second delay)
    try:
        code, err = run_cli(["data", "word_arith", "--n-train", "11440", "--out",
                             tmp_path / "d"], capsys)
    finally:
        data._BAR_ROWS = 100_000
    assert code == 0 and "Traceback" not in err
    assert (tmp_path / "d" / "train.jsonl").read_text().count("\n") == 11_440


# config keys that size a run's work: refused before any worker starts
CONFIG_SIZES = [
    ("trainer.val_samples", ["check", "trainer.val_samples=100000000"], "[1, 1024]"),
    ("rollout.n (memory)", ["check", "rollout.n=10000000", "--memory"], "does not fit"),
    ("rollout.max_new_tokens", ["check", "rollout.max_new_tokens=1000000000"], "positions"),
]


@pytest.mark.parametrize("name,argv,said", [pytest.param(*c, id=c[0]) for c in CONFIG_SIZES])
def test_a_config_key_that_sizes_work_is_refused_before_launch(name, argv, said, capsys):
    from tests.support.recorded_runs import graph_path
    code, err = run_cli([argv[0], graph_path("grpo.py"), *argv[1:]], capsys, seconds=120)
    assert code == 1 and said in err and "Traceback" not in err, err
