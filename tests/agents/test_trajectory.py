"""Tokens in, tokens out: over 1,000 random multi-turn episodes per chat format, the
ids the model is fed at turn k+1 are exactly the ids of turns 1..k, the trained
tokens are exactly the sampled ones, and the loss mask marks exactly the model's
tokens. Episodes are played by the real runner with a fake generator."""
import hashlib
import random

import pytest
import torch

from hybridflow.agents import (ChatTemplateFormat, EpisodeRunner, GeneratedTurn, PlainFormat,
                               RunnerOptions, Trajectory, layout_batch)
from tests.support.agent_fakes import (WORDS, ContextGenerator, ScriptedEnv, random_text,
                                       scripted_rows)

EPISODES = 1000


def _format(name, request):
    if name == "plain":
        return PlainFormat(request.getfixturevalue("char_tokenizer"))
    if name == "chatml":
        return ChatTemplateFormat(request.getfixturevalue("chatml_tokenizer"))
    return ChatTemplateFormat(request.getfixturevalue("chatml_tool_tokenizer"),
                              observation_role="tool", system="you may call calc")


def _ordinary_ids(tokenizer):
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def _segments(mask: list[int]):
    """(start, end, value) of each maximal run of equal values."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((start, i, mask[start]))
            start = i
    return runs


def _play(fmt, seed, budget=120):
    tok = fmt.tokenizer
    gen = ContextGenerator(_ordinary_ids(tok), min(fmt.stop_ids), max_len=8,
                           stop_probability=0.97)
    recorded = {}

    def generate(contexts, max_new_tokens):
        turns = gen(contexts, max_new_tokens)
        for context, turn in zip(contexts, turns):
            recorded[tuple(context)] = turn
        return turns

    vocabulary = WORDS if isinstance(fmt, ChatTemplateFormat) else None
    rows = scripted_rows(EPISODES, seed, max_turns=5, **({"vocabulary": vocabulary}
                                                         if vocabulary else {}))
    options = RunnerOptions(max_turns=5, max_response_tokens=budget, max_turn_tokens=8)
    result = EpisodeRunner(ScriptedEnv, generate, fmt, options).run(rows)
    return rows, result, recorded


@pytest.mark.parametrize("name", ["plain", "chatml", "chatml_tool"])
def test_trained_tokens_are_the_sampled_tokens_over_random_episodes(name, request):
    fmt = _format(name, request)
    rows, result, recorded = _play(fmt, seed=hash(name) % 1000)
    batch = result.to_batch(fmt.tokenizer.pad_token_id)
    P = batch["prompts"].shape[1]
    mismatches, mask_errors, turns_checked = 0, 0, 0
    for i, (row, episode) in enumerate(zip(rows, result.episodes)):
        attention = batch["attention_mask"][i].bool()
        full = batch["input_ids"][i][attention].tolist()
        loss = batch["loss_mask"][i].tolist()
        response_mask = batch["response_mask"][i].tolist()
        n_resp = int(batch["response_length"][i])
        mask_errors += any(m and not r for m, r in zip(loss, response_mask))
        mask_errors += response_mask != [1] * n_resp + [0] * (len(response_mask) - n_resp)
        prompt = fmt.prompt_ids(row["prompt"])
        mismatches += full[:len(prompt)] != prompt
        observations = iter(row["observations"])
        for start, end, is_model in _segments(loss[:n_resp]):
            at = len(prompt) + start
            piece = full[at:at + end - start]
            if is_model:
                turn = recorded.get(tuple(full[:at]))  # the generator was fed exactly this
                mismatches += turn is None or turn.token_ids[:len(piece)] != piece
                if turn is not None:
                    logps = batch["rollout_log_probs"][i, start:end].tolist()
                    mismatches += not torch.allclose(torch.tensor(logps),
                                                     torch.tensor(turn.log_probs[:len(piece)]))
                turns_checked += 1
            else:
                observation = next(observations)
                mismatches += piece != fmt.observation_ids(observation)
                tok = fmt.tokenizer  # independent of the format: the text is in there
                as_tokenized = tok.decode(tok(observation, add_special_tokens=False)["input_ids"])
                mismatches += as_tokenized not in tok.decode(piece)
        model_runs = sum(v for *_, v in _segments(loss[:n_resp]))
        mask_errors += episode.trajectory.model_turns != model_runs
        mask_errors += batch["rollout_log_probs"][i][~batch["loss_mask"][i].bool()].abs().sum() > 0
    assert turns_checked >= EPISODES
    assert (mismatches, mask_errors) == (0, 0)
    assert batch["input_ids"].shape[1] == P + batch["responses"].shape[1]
    statuses = {e.status for e in result.episodes}
    assert statuses <= {"done", "truncated"} and "done" in statuses


class CanonicalGenerator:
    """Turns that are the tokenizer's own encoding of a random text, then the stop
    token, so a whole episode can be compared with the template's rendering."""

    def __init__(self, tokenizer, stop_id):
        self.tok, self.stop_id, self.texts = tokenizer, stop_id, {}

    def __call__(self, contexts, max_new_tokens):
        turns = []
        for context in contexts:
            rng = random.Random(hashlib.sha1(str(context).encode()).hexdigest())
            text = random_text(rng)
            self.texts[tuple(context)] = text
            ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.stop_id]
            turns.append(GeneratedTurn(ids[:max_new_tokens]))
        return turns


@pytest.mark.parametrize("name,role", [("chatml", "user"), ("chatml_tool", "tool")])
def test_a_finished_episode_is_the_templates_rendering_of_its_conversation(name, role,
                                                                           request):
    fmt = _format(name, request)
    tok = fmt.tokenizer
    gen = CanonicalGenerator(tok, tok.eos_token_id)
    rows = scripted_rows(200, seed=7, max_turns=4, vocabulary=WORDS)
    options = RunnerOptions(max_turns=4, max_response_tokens=400, max_turn_tokens=40)
    result = EpisodeRunner(ScriptedEnv, gen, fmt, options).run(rows)
    checked = 0
    for row, episode in zip(rows, result.episodes):
        assert episode.status == "done"
        traj = episode.trajectory
        messages = list(fmt.head) + [{"role": "user", "content": row["prompt"]}]
        context = list(traj.prompt_ids)
        for k in range(traj.model_turns):
            text = gen.texts[tuple(context)]
            context += tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            messages.append({"role": "assistant", "content": text})
            if k + 1 < traj.model_turns:
                observation = row["observations"][k]
                context += fmt.observation_ids(observation)
                messages.append({"role": role, "content": observation})
        rendered = fmt._render(messages, generation_prompt=False)
        assert traj.context_ids() == context
        assert rendered[:len(context)] == context, row
        checked += 1
    assert checked == 200


def test_layout_pads_prompts_left_and_responses_right():
    a = Trajectory([5, 6, 7])
    a.add_model_turn([8, 9], [-0.5, -0.25])
    a.add_observation([10])
    a.add_model_turn([11], [-1.0])
    b = Trajectory([5])
    b.add_model_turn([12], [-2.0])
    out = layout_batch([a, b], pad_id=0, response_width=6)
    assert out["prompts"].tolist() == [[5, 6, 7], [0, 0, 5]]
    assert out["responses"].tolist() == [[8, 9, 10, 11, 0, 0], [12, 0, 0, 0, 0, 0]]
    assert out["loss_mask"].tolist() == [[1, 1, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0]]
    assert out["response_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]]
    assert out["attention_mask"][1].tolist() == [0, 0, 1, 1, 0, 0, 0, 0, 0]
    assert out["position_ids"][1, :4].tolist() == [0, 0, 0, 1]
    assert out["rollout_log_probs"][0].tolist() == [-0.5, -0.25, 0.0, -1.0, 0.0, 0.0]
    assert out["response_length"].tolist() == [4, 1]
    assert a.model_token_ids() == [8, 9, 11]


def test_a_turn_with_the_wrong_number_of_log_probs_is_refused():
    with pytest.raises(ValueError, match="2 tokens came with 1 log-probs"):
        Trajectory([1]).add_model_turn([2, 3], [-0.1])
