"""Prompt datasets: verl's schema, validation naming file and row, loader position."""
import json

import pytest

from hybridflow.core.loading import UserFileError
from hybridflow.core.data import (DataError, PromptDataset, PromptLoader, read_rows, toy_rows,
                                  write_rows)
from hybridflow.workers.tokenizer import load_tokenizer

TOK = load_tokenizer("char")


def _row(prompt="1+2=", **extra):
    return {"data_source": "toy_arith", "prompt": prompt,
            "reward_model": {"ground_truth": "3"}, **extra}


def _write_jsonl(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("row, words", [
    ({"data_source": "x", "reward_model": {"ground_truth": "1"}}, ["row 0", "'prompt'"]),
    ({"prompt": "1+1=", "reward_model": {"ground_truth": "2"}}, ["row 0", "'data_source'"]),
    ({"prompt": "1+1=", "data_source": "x"}, ["row 0", "reward_model.ground_truth"]),
    (_row(prompt="   "), ["row 0", "empty prompt"]),
    (_row(prompt=7), ["row 0", "'prompt' must be a string"]),
])
def test_malformed_rows_name_the_row(row, words):
    with pytest.raises(DataError) as err:
        PromptDataset([row], TOK, 16, name="train.jsonl")
    for word in words:
        assert word in str(err.value)


def test_invalid_json_line_names_file_and_line(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", [json.dumps(_row()), "{not json"])
    with pytest.raises(UserFileError, match=r"d.jsonl' line 2 is not valid JSON"):
        read_rows(path)


def test_invalid_parquet_and_missing_file(tmp_path):
    bad = tmp_path / "d.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(UserFileError, match="not a valid parquet"):
        read_rows(str(bad))
    with pytest.raises(UserFileError, match="does not exist"):
        read_rows(str(tmp_path / "missing.jsonl"))


def test_overlong_prompts_filtered_or_refused():
    rows = [_row(), _row(prompt="1+2+3+4+5=")]
    kept = PromptDataset(rows, TOK, 5)
    assert len(kept) == 1 and kept.dropped == 1
    with pytest.raises(DataError, match="row 1: prompt has 10 tokens"):
        PromptDataset(rows, TOK, 5, filter_overlong=False)


def test_chat_messages_without_template_are_joined():
    ds = PromptDataset([_row(prompt=[{"role": "user", "content": "4+4="}])], TOK, 16)
    assert ds.rows[0].text == "4+4="


def test_parquet_round_trip(tmp_path):
    train, _ = toy_rows(1, 9, 0.25)
    write_rows(train, str(tmp_path / "t.parquet"))
    ds = PromptDataset.from_file(str(tmp_path / "t.parquet"), TOK, 16)
    assert len(ds) == len(train) == 75


def test_loader_left_pads_and_resumes_at_the_same_batch():
    ds = PromptDataset([_row(prompt=f"{i}+{j}=") for i in range(12) for j in range(3)], TOK, 16)
    loader = PromptLoader(ds, 8, TOK.pad_token_id, seed=3)
    first = loader.next_batch()
    assert first["attention_mask"][:, -1].all()  # left padding: last column always real
    assert len(set(first["uid"])) == 8
    state = loader.state_dict()
    expected = loader.next_batch()
    other = PromptLoader(ds, 8, TOK.pad_token_id, seed=3)
    other.load_state_dict(state)
    again = other.next_batch()
    assert list(again["raw_prompt"]) == list(expected["raw_prompt"])
    assert list(again["uid"]) == list(expected["uid"])


def test_batch_larger_than_dataset_is_refused():
    with pytest.raises(DataError, match="data.batch_size=4 is larger than the 1 usable rows"):
        PromptLoader(PromptDataset([_row()], TOK, 16), 4, 0)


def test_held_out_pairs_never_in_train():
    train, test = toy_rows(1, 9, 0.25)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}


# ---- values the reward scorer needs, checked when the data is loaded
def _reward_checker(**reward):
    from hybridflow.workers.reward import RewardWorker
    return RewardWorker.data_row_check({"reward": reward})


@pytest.mark.parametrize("row, words", [
    (_row(data_source="toy_arithmetic"), ["row 1", "data_source 'toy_arithmetic'", "toy_arith"]),
    ({**_row(), "reward_model": {"ground_truth": None}}, ["row 1", "ground_truth is null"]),
    ({**_row(), "reward_model": {"ground_truth": ["3", "03"]}}, ["row 1", "ground_truth", "list"]),
])
def test_values_the_built_in_scorer_cannot_use_are_refused_at_load(tmp_path, row, words):
    path = _write_jsonl(tmp_path / "train.jsonl", [json.dumps(_row()), json.dumps(row)])
    with pytest.raises(DataError) as err:
        PromptDataset.from_file(path, TOK, 16, check_row=_reward_checker())
    for word in [path, *words]:
        assert word in str(err.value)


def test_a_user_scorer_may_take_any_data_source_and_a_list_but_not_a_null(tmp_path):
    rows = [_row(data_source="mine"), {**_row(), "reward_model": {"ground_truth": ["3"]}}]
    check = _reward_checker(function_path="my_reward.py")
    assert len(PromptDataset(rows, TOK, 16, check_row=check)) == 2
    with pytest.raises(DataError, match="row 0: .*ground_truth is null"):
        PromptDataset([{**_row(), "reward_model": {"ground_truth": None}}], TOK, 16,
                      check_row=check)


def test_a_reward_model_reads_no_ground_truth():
    assert _reward_checker(model_path="/models/rm") is None


def test_row_checks_come_from_the_roles_the_plan_calls():
    import os

    from hybridflow.program.assemble import prepare
    from hybridflow.core.data import row_checker
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    grpo = prepare(os.path.join(repo, "graphs", "grpo.py"), preflight=False)
    sft = prepare(os.path.join(repo, "graphs", "sft.py"), preflight=False)
    assert row_checker(grpo.plan, grpo.cfg) is not None
    assert row_checker(sft.plan, sft.cfg) is None  # no reward.score: nothing to check


def test_the_toy_rows_come_from_the_maker_config_names():
    train, test = toy_rows(1, 4, 0.25, maker="tests.support.named:two_row_maker")
    assert [r["prompt"] for r in train] == ["4+1="] and [r["prompt"] for r in test] == ["1+4="]
    with pytest.raises(DataError, match=r"data.toy.maker='tests.support.named:nope': "
                                        r"'tests.support.named' defines no 'nope'"):
        toy_rows(1, 4, 0.25, maker="tests.support.named:nope")
