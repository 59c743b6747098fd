"""Reward functions: the toy task, GSM8K and the table of scorers by data_source
(the machinery that loads and calls scorers is the engine's: tests/workers/test_scoring.py)."""
import pytest

from algorithms import rewards
from algorithms.rewards import gsm8k, toy


# ---------------------------------------------------------------- toy task: data

def test_toy_rows_follow_the_verl_schema_and_are_correct():
    rows = toy.make_problems(30, seed=1)
    assert [r["extra_info"]["index"] for r in rows] == list(range(30))
    for r in rows:
        assert set(r) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert r["data_source"] == "toy_arith" and r["ability"] == "math"
        a, b = r["prompt"].rstrip("=").split("+")
        assert r["prompt"].endswith("=") and 0 <= int(a) <= 9 and 0 <= int(b) <= 9
        assert r["reward_model"]["ground_truth"] == str(int(a) + int(b))


def test_toy_problems_are_deterministic_and_seeded():
    assert toy.make_problems(20, seed=3) == toy.make_problems(20, seed=3)
    assert toy.make_problems(20, seed=3) != toy.make_problems(20, seed=4)


def test_toy_problems_are_distinct_until_the_pairs_run_out():
    assert len({r["prompt"] for r in toy.make_problems(100, seed=0)}) == 100
    many = toy.make_problems(250, seed=0)
    assert len(many) == 250 and len({r["prompt"] for r in many}) == 100


def test_toy_max_operand_and_bounds():
    rows = toy.make_problems(9, seed=0, max_operand=2)
    assert {r["prompt"] for r in rows} == {f"{a}+{b}=" for a in range(3) for b in range(3)}
    assert toy.make_problems(0, seed=0) == []
    with pytest.raises(ValueError, match="max_operand must be >= 0"):
        toy.make_problems(1, seed=0, max_operand=-1)
    with pytest.raises(ValueError, match="number of problems must be >= 0"):
        toy.make_problems(-1, seed=0)


def test_toy_split_holds_problems_out_of_train():
    train, test = toy.train_test_split(300, 50, seed=7)
    assert len(train) == 300 and len(test) == 50
    train_prompts, test_prompts = {r["prompt"] for r in train}, {r["prompt"] for r in test}
    assert not train_prompts & test_prompts
    assert len(test_prompts) == 20 and len(train_prompts) == 80  # 20% of the 100 pairs held out
    assert toy.train_test_split(300, 50, seed=7) == (train, test)
    assert toy.split_pairs(seed=8) != toy.split_pairs(seed=7)


def test_toy_split_needs_something_to_hold_out():
    with pytest.raises(ValueError, match="nothing to hold out"):
        toy.train_test_split(4, 1, max_operand=0)
    with pytest.raises(ValueError, match=r"test_fraction must be in \(0, 1\)"):
        toy.split_pairs(test_fraction=1.0)
    train_pairs, test_pairs = toy.split_pairs(max_operand=1, test_fraction=0.01)
    assert len(test_pairs) == 1 and len(train_pairs) == 3


# ---------------------------------------------------------------- toy task: score

@pytest.mark.parametrize("response, score", [
    ("12", 1.0),
    (" 12 ", 1.0),
    ("12\n3+4=7", 1.0),            # stops at the first newline
    ("12<|endoftext|>junk", 1.0),  # stops at the end-of-text marker
    ("12</s>", 1.0),
    ("123", 0.0),
    ("1 2", 0.0),
    ("12.0", 0.0),
    ("", 0.0),                     # empty response
    ("\n12", 0.0),                 # the answer must come first
    ("<|endoftext|>12", 0.0),
])
def test_toy_score_is_exact_match(response, score):
    assert toy.compute_score("toy_arith", response, "12") == score


# ---------------------------------------------------------------- gsm8k

@pytest.mark.parametrize("text, method, answer", [
    ("so she has 5 + 7 = 12 apples.\n#### 12", "strict", "12"),
    ("#### 1,234", "strict", "1234"),
    ("#### -3", "strict", "-3"),
    ("#### 72.", "strict", "72"),
    ("#### 5 then later #### 6", "strict", "6"),
    ("the answer is 12", "strict", None),     # strict demands the format
    ("####12", "strict", None),
    ("I think 3 apples, then 1,500 pears.", "flexible", "1500"),
    ("costs $40.", "flexible", "40"),
    ("no digits at all.", "flexible", None),
])
def test_gsm8k_extraction(text, method, answer):
    assert gsm8k.extract_solution(text, method) == answer


def test_gsm8k_score_strict_flexible_and_format_score():
    assert gsm8k.compute_score("openai/gsm8k", "#### 1,234", "1234") == 1.0
    raw_solution = "Natalia ... #### 1,234"
    assert gsm8k.compute_score("openai/gsm8k", "#### 1,234", raw_solution) == 1.0
    assert gsm8k.compute_score("openai/gsm8k", "It is 18", "18") == 0.0
    assert gsm8k.compute_score("openai/gsm8k", "It is 18", "18", method="flexible") == 1.0
    assert gsm8k.compute_score("openai/gsm8k", "#### 17", "18", format_score=0.1) == 0.1
    assert gsm8k.compute_score("openai/gsm8k", "", "18", format_score=0.1) == 0.0


def test_gsm8k_reads_only_the_tail_of_long_responses():
    assert gsm8k.compute_score("gsm8k", "#### 9 " + "blah " * 100 + "#### 18", "18") == 1.0
    assert gsm8k.extract_solution("#### 9 " + "x" * 400) is None


def test_gsm8k_rejects_unknown_method():
    with pytest.raises(ValueError, match="unknown extraction method 'loose'"):
        gsm8k.extract_solution("#### 1", "loose")


# ---------------------------------------------------------------- dispatcher and results

def test_dispatch_by_data_source():
    assert rewards.compute_score("toy_arith", "9", "9") == 1.0
    assert rewards.compute_score("openai/gsm8k", "#### 9", "9") == 1.0
    assert rewards.compute_score("gsm8k", "#### 9", "8") == 0.0
    with pytest.raises(ValueError, match=r"unknown data_source.*'math500'.*gsm8k.*toy_arith"):
        rewards.compute_score("math500", "9", "9")
    assert rewards.compute_score("gsm8k", "it is 9", "9", method="flexible") == 1.0  # kwargs


def test_the_toy_maker_holds_the_test_pairs_out_unless_asked():
    train, test = toy.train_test_rows(1, 9, 0.25)
    assert len(train) == 75 and len(test) == 25
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    both, _ = toy.train_test_rows(1, 9, 0.25, train_on_test=True)
    assert both == train + test
