"""The toy agent task: the calculator tool, its environment through the runner, and
its data (disjoint train/test rows, SFT demonstrations)."""
import random

import pytest

from graphs.envs import calculator
from hybridflow.agents import (EpisodeRunner, GeneratedTurn, PlainFormat, RunnerOptions,
                               check_environment)
from hybridflow.workers.tokenizer import build_char_tokenizer


def test_calc_adds_whole_numbers_and_refuses_anything_else():
    assert calculator.add_numbers("48213+90872") == "139085"
    assert calculator.add_numbers("1 + 2+3") == "6"
    for bad in ("12+", "12*3", "x+1", "12"):
        with pytest.raises(ValueError, match="whole numbers"):
            calculator.add_numbers(bad)


def test_the_declared_environment_loads():
    factory = check_environment(f"{calculator.__file__}:make_env")
    assert factory().reset({"raw_prompt": "1+2=", "ground_truth": "3"}) == "1+2="


class Scripted:
    """Writes, per episode (by its prompt), the turns given in `plan`."""

    def __init__(self, tok, plan):
        self.tok, self.plan, self.turn = tok, plan, {}

    def __call__(self, contexts, max_new_tokens):
        out = []
        for context in contexts:
            text = self.tok.decode(context)
            prompt = text.split("=")[0] + "="
            k = self.turn.get(prompt, 0)
            self.turn[prompt] = k + 1
            texts = self.plan(prompt)
            ids = self.tok(texts[k], add_special_tokens=False)["input_ids"]
            out.append(GeneratedTurn(ids + [self.tok.eos_token_id]))
        return out


@pytest.mark.parametrize("style,reward,status", [
    ("tool", 1.0, "done"), ("alone_wrong", 0.0, "done"), ("malformed", 0.0, "tool_error"),
    ("bad_args", 0.0, "tool_error")])
def test_episodes_through_the_runner(style, reward, status):
    tok = build_char_tokenizer()
    train, _ = calculator.train_test_split(4, 0, seed=1)
    rows = [calculator.as_episode_row(r) for r in train]
    answers = {r["raw_prompt"]: r["ground_truth"] for r in rows}

    def plan(prompt):
        expression, answer = prompt.rstrip("="), answers[prompt]
        return {"tool": [f"calc({expression})", answer],
                "alone_wrong": [str(int(answer) + 1)],
                "malformed": [f"calc({expression}"],
                "bad_args": ["calc(1*2)"]}[style]

    result = EpisodeRunner(calculator.make_env, Scripted(tok, plan), PlainFormat(tok),
                           RunnerOptions(max_turns=3, max_turn_tokens=40)).run(rows)
    assert [e.status for e in result.episodes] == [status] * 4
    assert [e.reward for e in result.episodes] == [reward] * 4
    if style == "tool":
        assert result.metrics["agent/tool_calls/mean"] == 1.0
        text = tok.decode(result.episodes[0].trajectory.context_ids())
        assert "\ncalc: " + rows[0]["ground_truth"] + "\nanswer: " in text


def test_train_and_test_problems_are_disjoint_and_deterministic():
    train, test = calculator.train_test_split(200, 50, seed=3, digits=5)
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in test})
    assert calculator.train_test_split(200, 50, seed=3) == (train, test)
    a, b = map(int, train[0]["prompt"].rstrip("=").split("+"))
    assert 10000 <= a <= 99999 and str(a + b) == train[0]["reward_model"]["ground_truth"]


def test_demonstrations_call_the_tool_or_answer_alone():
    row = calculator.train_test_split(1, 0, seed=4)[0][0]
    rng = random.Random(0)
    demos = [calculator.demonstration(row, rng) for _ in range(200)]
    calls = [d for d in demos if len(d) == 3]
    assert calls and all(d[0][1] and not d[1][1] and d[2][1] for d in calls)
    assert all(d[2][0] == row["reward_model"]["ground_truth"] for d in calls)
    assert any(len(d) == 1 and d[0][0].startswith("calc(") for d in demos)  # malformed


def test_sft_demonstrations_are_tokenised_as_the_rollout_tokenises_episodes(tmp_path):
    """A model that wrote a demonstration's turns would produce, through the runner,
    exactly the demonstration's ids and loss mask."""
    from graphs.envs.calculator_sft import ToolSFTExamples, write_data
    from hybridflow.core.batch import Batch
    from hybridflow.core.data import read_rows
    train_path, test_path = write_data(str(tmp_path), n_train=6, n_test=2, seed=5)
    rows = [calculator.as_episode_row(r) for r in read_rows(train_path)]
    assert len(read_rows(test_path)) == 2
    make = ToolSFTExamples("char", call_probability=1.0, malformed_probability=0.0, seed=0)
    examples = make(Batch(non_tensors={"raw_prompt": [r["raw_prompt"] for r in rows],
                                       "ground_truth": [r["ground_truth"] for r in rows]}))
    tok = make.fmt.tokenizer
    answers = {r["raw_prompt"]: r["ground_truth"] for r in rows}
    plan = lambda prompt: [f"calc({prompt.rstrip('=')})", answers[prompt]]  # noqa: E731
    result = EpisodeRunner(calculator.make_env, Scripted(tok, plan), make.fmt,
                           RunnerOptions(max_turns=3, max_turn_tokens=40)).run(rows)
    for i, episode in enumerate(result.episodes):
        assert episode.reward == 1.0
        n = int(examples["attention_mask"][i].sum())
        traj = episode.trajectory
        assert examples["input_ids"][i, :n].tolist() == traj.context_ids()
        assert examples["loss_mask"][i, len(traj.prompt_ids):n].tolist() == traj.loss_mask
        assert examples["loss_mask"][i, :len(traj.prompt_ids)].sum() == 0
