"""Objects tests name in config by import path ("tests.support.named:NAME"), the
way a user names their own scorer table or toy data maker."""
from __future__ import annotations


def _length_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str))


LENGTH_TABLE = {"length": _length_score}  # reward.scorer_table


def two_row_maker(seed, max_operand, test_fraction, train_on_test):
    """data.toy.maker: one train row and one held-out row, whatever the arguments."""
    row = {"data_source": "length", "prompt": f"{max_operand}+1=", "ability": "math",
           "reward_model": {"ground_truth": str(max_operand + 1)}, "extra_info": {}}
    return [row], [dict(row, prompt=f"1+{max_operand}=")]


NOT_A_TABLE = ["length"]  # a list of names, not a mapping data_source -> scorer

# data.toy.maker naming what is not a function (each must fail `check`)
MAKER_STRING = "algorithms.rewards.toy:train_test_rows"
MAKER_NUMBER = 7
MAKER_TABLE = {"train": []}
MAKER_ROWS = [{"prompt": "1+1="}]
