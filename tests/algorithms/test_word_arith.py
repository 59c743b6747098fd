"""The word_arith task: deterministic rows in verl's schema with chat prompts, train
and test from disjoint problems, answers the GSM8K scorer accepts, and the data
command that writes them."""
import json

import pytest

from algorithms.rewards import SCORERS, compute_score, gsm8k
from algorithms.rewards.word_arith import (DATA_SOURCE, INSTRUCTION, all_problems, answer_of,
                                           train_test_rows)
from hybridflow.cli import main


def test_rows_are_deterministic_in_the_seed_and_differ_across_seeds():
    assert train_test_rows(3, 50, 10) == train_test_rows(3, 50, 10)
    assert train_test_rows(3, 50, 10) != train_test_rows(4, 50, 10)


def test_rows_follow_verls_schema_with_a_chat_prompt_and_gsm8k_answers():
    train, test = train_test_rows(1, 40, 20)
    assert (len(train), len(test)) == (40, 20)
    for row in train + test:
        assert row["data_source"] == DATA_SOURCE and row["ability"] == "math"
        (message,) = row["prompt"]
        assert message["role"] == "user" and message["content"].endswith(INSTRUCTION)
        truth = row["reward_model"]["ground_truth"]
        work, final = row["extra_info"]["answer"].split("\n")
        assert final == f"#### {truth}"
        a, op, b = work.split(" = ")[0].split()
        assert answer_of({"+": "add", "-": "sub", "*": "mul"}[op], int(a), int(b)) == int(truth)
        assert int(truth) >= 0  # subtraction keeps a > b
        # the worked answer scores 1 under both extractions; a wrong number scores 0
        assert compute_score(DATA_SOURCE, row["extra_info"]["answer"], truth) == 1.0
        assert compute_score(DATA_SOURCE, f"#### {int(truth) + 1}", truth,
                             method="flexible") == 0.0


def test_train_and_test_problems_are_disjoint():
    problems = all_problems(20)
    train, test = train_test_rows(1, len(problems), 100)
    held = {tuple(r["extra_info"]["problem"]) for r in test}
    seen = {tuple(r["extra_info"]["problem"]) for r in train}
    assert len(held) == 100
    assert not held & seen
    assert len(seen) == len(problems) - 100  # every other problem is trained on


def test_the_gsm8k_scorer_is_registered_for_the_task():
    assert SCORERS[DATA_SOURCE] is gsm8k.compute_score


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="max_number must be at least 3"):
        all_problems(2)
    with pytest.raises(ValueError, match="leaves no training problem"):
        train_test_rows(1, 10, len(all_problems(5)), max_number=5)


def test_data_command_writes_train_and_test_files(tmp_path, capsys):
    out = tmp_path / "wa"
    assert main(["data", "word_arith", "--out", str(out), "--n-train", "30",
                 "--n-test", "7", "--seed", "2"]) == 0
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (out / "test.jsonl").read_text().splitlines()]
    assert (len(train), len(test)) == (30, 7)
    assert (train, test) == train_test_rows(2, 30, 7)
    assert main(["data", "word_arith", "--out", str(out), "--n-test", "100000"]) == 1
    assert "leaves no training problem" in capsys.readouterr().err
