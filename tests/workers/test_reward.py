"""RewardWorker: rule scores at the last valid response token, clear scorer errors,
a process pool with a per-sample timeout, and a reward model from a local dir."""
import textwrap

import pytest
import torch
from transformers import AutoModelForSequenceClassification, LlamaConfig

from tests.support.workers import TINY, empty_like, make_cfg
from hybridflow.core.batch import Batch
from hybridflow.workers import RewardWorker
from hybridflow.workers.reward_pool import ScoringError
from hybridflow.workers.tokenizer import build_char_tokenizer

WIDTH = 5


def response_batch(tok, answers, truths, prompts=None, sources=None):
    eos, pad = tok.eos_token_id, tok.pad_token_id
    rows = []
    for text in answers:
        ids = tok(text, add_special_tokens=False)["input_ids"][:WIDTH]
        ids = ids + [eos] if len(ids) < WIDTH else ids
        rows.append(ids + [pad] * (WIDTH - len(ids)))
    responses = torch.tensor(rows)
    mask = torch.tensor([[1] * min(len(a) + 1, WIDTH) + [0] * (WIDTH - min(len(a) + 1, WIDTH))
                         for a in answers])
    cols = {"responses": responses, "response_mask": mask}
    if prompts:
        cols["prompts"] = tok(prompts, padding=True, return_tensors="pt")["input_ids"]
    return Batch(cols, {"data_source": sources or ["toy_arith"] * len(answers),
                        "ground_truth": truths})


def test_rule_scores_land_on_the_last_valid_token():
    worker = RewardWorker(make_cfg())
    batch = response_batch(worker.tokenizer, ["3", "12", "1234567"], ["3", "13", "12345"])
    out = worker.score(batch)
    assert out["scores"].tolist() == [1.0, 0.0, 1.0]
    expected = torch.zeros(3, WIDTH)
    expected[0, 1] = 1.0  # "3" + eos: last valid token is the eos at index 1
    expected[2, WIDTH - 1] = 1.0  # truncated, no eos: the last token
    assert torch.equal(out["token_level_scores"], expected)
    assert out.meta["metrics"]["critic/score/mean"] == pytest.approx(2 / 3)
    assert worker.score(empty_like(batch))["token_level_scores"].shape == (0, WIDTH)


@pytest.fixture
def scorer_file(tmp_path):
    path = tmp_path / "my_scorer.py"
    path.write_text(textwrap.dedent("""
        import math, time
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if ground_truth == "boom":
                raise RuntimeError("cannot parse")
            if ground_truth == "nan":
                return math.nan
            if ground_truth == "slow":
                time.sleep(30)
            return {"score": float(solution_str == ground_truth), "length": len(solution_str)}
    """))
    return str(path)


def test_user_scorer_dict_extras_become_metrics(scorer_file):
    worker = RewardWorker(make_cfg(reward={"function_path": scorer_file}))
    out = worker.score(response_batch(worker.tokenizer, ["3", "45"], ["3", "4"]))
    assert out["scores"].tolist() == [1.0, 0.0]
    assert out.meta["metrics"]["reward/length"] == pytest.approx(1.5)


@pytest.mark.parametrize("truth, message", [("boom", "cannot parse"), ("nan", "returned nan")])
def test_scorer_failure_names_row_data_source_and_scorer(scorer_file, truth, message):
    worker = RewardWorker(make_cfg(reward={"function_path": scorer_file}))
    batch = response_batch(worker.tokenizer, ["3", "4"], ["3", truth], sources=["a", "mine"])
    with pytest.raises(ScoringError, match=message) as err:
        worker.score(batch)
    assert "row 1" in str(err.value) and "'mine'" in str(err.value)
    assert "my_scorer.py" in str(err.value)


@pytest.mark.slow  # waits out a scorer timeout in a process pool (~8 s)
def test_process_pool_times_out_a_slow_sample(scorer_file):
    worker = RewardWorker(make_cfg(reward={"function_path": scorer_file, "num_workers": 2,
                                           "timeout_s": 1.0}))
    try:
        out = worker.score(response_batch(worker.tokenizer, ["3", "x", "5"], ["3", "slow", "5"]))
    finally:
        worker.rule.close()
    assert out["scores"].tolist() == [1.0, 0.0, 1.0]
    assert out.meta["metrics"]["reward/timeouts_total"] == 1.0


def test_in_process_scoring_times_out_a_slow_sample_too(scorer_file):
    worker = RewardWorker(make_cfg(reward={"function_path": scorer_file, "timeout_s": 0.5}))
    out = worker.score(response_batch(worker.tokenizer, ["3", "x", "5"], ["3", "slow", "5"]))
    assert out["scores"].tolist() == [1.0, 0.0, 1.0]
    assert out.meta["metrics"]["reward/timeouts_total"] == 1.0


def test_a_sample_timeout_does_not_swallow_an_outer_deadline(scorer_file):
    from hybridflow.core.deadline import CallTimeout, call_with_deadline
    worker = RewardWorker(make_cfg(reward={"function_path": scorer_file, "timeout_s": 20}))
    batch = response_batch(worker.tokenizer, ["x"], ["slow"])
    with pytest.raises(CallTimeout, match="node 'reward.score'"):
        call_with_deadline(lambda: worker.score(batch), 0.5, "node 'reward.score'")


def test_reward_model_from_a_saved_directory(tmp_path):
    tok = build_char_tokenizer()
    config = LlamaConfig(**{k: v for k, v in TINY.items() if k != "model_type"},
                         vocab_size=len(tok), pad_token_id=tok.pad_token_id, num_labels=1)
    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_config(config).eval()
    rm.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    worker = RewardWorker(make_cfg(reward={"model_path": str(tmp_path)}))
    batch = response_batch(tok, ["3", "12"], ["3", "3"], prompts=["1+2=", "10+2="])
    out = worker.score(batch)
    with torch.no_grad():
        manual = [rm(**tok([text], return_tensors="pt")).logits[0, 0].item()
                  for text in ["1+2=3", "10+2=12"]]
    assert out["scores"].tolist() == pytest.approx(manual, abs=1e-5)
    assert out["token_level_scores"][0, 1] == out["scores"][0]
    assert out["token_level_scores"][1, 2] == out["scores"][1]


# ---- the reward API: response facts, config arguments, named weighted components
@pytest.fixture
def rich_scorers(tmp_path):
    path = tmp_path / "rich.py"
    path.write_text(textwrap.dedent("""
        def correct(data_source, solution_str, ground_truth, extra_info=None):
            return float(solution_str == ground_truth)

        def brevity(data_source, solution_str, ground_truth, extra_info=None, *,
                    response_length, stopped, limit=3):
            return (1.0 if response_length <= limit else 0.0) if stopped else -1.0

        def seen(data_source, solution_str, ground_truth, **facts):
            return {"score": 0.0, "length": facts["response_length"],
                    "stopped": facts["stopped"]}
    """))
    return str(path)


def test_a_scorer_may_read_the_token_count_and_whether_the_response_stopped(rich_scorers):
    worker = RewardWorker(make_cfg(reward={"function_path": rich_scorers,
                                           "function_name": "seen"}))
    out = worker.score(response_batch(worker.tokenizer, ["3", "1234567"], ["3", "3"]))
    # "3" + eos: 2 tokens and stopped; "1234567" truncated at 5 tokens: not stopped
    assert out.meta["metrics"]["reward/length"] == pytest.approx((2 + 5) / 2)
    assert out.meta["metrics"]["reward/stopped"] == pytest.approx(0.5)


def test_scorer_arguments_come_from_config(rich_scorers):
    batch_texts = (["3", "12"], ["3", "12"])  # 2 and 3 tokens with eos
    default = RewardWorker(make_cfg(reward={"function_path": rich_scorers,
                                            "function_name": "brevity"}))
    assert default.score(response_batch(default.tokenizer, *batch_texts))["scores"].tolist() \
        == [1.0, 1.0]
    strict = RewardWorker(make_cfg(reward={"function_path": rich_scorers,
                                           "function_name": "brevity",
                                           "kwargs": {"limit": 2}}))
    assert strict.score(response_batch(strict.tokenizer, *batch_texts))["scores"].tolist() \
        == [1.0, 0.0]


def test_named_weighted_scorers_add_up_and_each_is_logged(rich_scorers):
    scorers = {"correct": {"function_path": rich_scorers, "function_name": "correct",
                           "weight": 1.0},
               "brevity": {"function_path": rich_scorers, "function_name": "brevity",
                           "weight": 0.5, "kwargs": {"limit": 2}},
               "builtin": {"weight": 2.0}}  # the built-in scorer of the data_source
    worker = RewardWorker(make_cfg(reward={"scorers": scorers}))
    out = worker.score(response_batch(worker.tokenizer, ["3", "12"], ["3", "13"]))
    # row 0: correct 1, brevity 1 (2 tokens), built-in 1; row 1: 0, 0 (3 tokens), 0
    assert out["scores"].tolist() == [1.0 + 0.5 + 2.0, 0.0]
    metrics = out.meta["metrics"]
    assert metrics["reward/correct/mean"] == 0.5
    assert metrics["reward/brevity/mean"] == 0.5
    assert metrics["reward/builtin/mean"] == 0.5
    assert metrics["critic/score/mean"] == pytest.approx(3.5 / 2)


def test_a_scorer_that_needs_an_argument_nobody_gives_is_refused_at_start(rich_scorers):
    with pytest.raises(TypeError, match="brevity"):
        RewardWorker(make_cfg(reward={"function_path": rich_scorers, "function_name": "brevity",
                                      "kwargs": {"unknown_knob": 1}}))


def test_the_scorer_table_is_named_in_config_and_checks_rows_against_it():
    cfg = make_cfg(reward={"scorer_table": "tests.support.named:LENGTH_TABLE"})
    worker = RewardWorker(cfg)
    batch = response_batch(worker.tokenizer, ["ab", "abcd"], ["x", "y"], sources=["length"] * 2)
    assert worker.score(batch)["scores"].tolist() == [2.0, 4.0]
    check = RewardWorker.data_row_check(cfg)
    check("length", "x")
    with pytest.raises(ValueError, match=r"data_source 'toy_arith' \(built-in: length\)"):
        check("toy_arith", "3")
    assert "tests.support.named:LENGTH_TABLE" in RewardWorker.model_source(cfg)


def test_a_scorer_table_that_is_no_mapping_is_refused_at_construction():
    with pytest.raises(ValueError, match="reward.scorer_table='tests.support.named:NOT_A_TABLE"
                                         "' must name a mapping"):
        RewardWorker(make_cfg(reward={"scorer_table": "tests.support.named:NOT_A_TABLE"}))
