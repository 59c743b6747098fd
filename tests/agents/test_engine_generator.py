"""EngineGenerator drives a real Hugging Face model (the rollout role's `hf` engine
on a tiny Llama built from a config) through multi-turn episodes: the tokens the
engine sampled are the tokens in the batch, and a teacher-forced forward over the
whole multi-turn batch gives the log-probs the engine reported for them."""
import pytest
import torch

from hybridflow.agents import EpisodeRunner, PlainFormat, RunnerOptions
from hybridflow.agents.engine_generator import EngineGenerator, left_pad
from hybridflow.workers.config import ModelConfig, RolloutConfig
from hybridflow.workers.models import build_causal_lm
from hybridflow.workers.rollout.hf import HFEngine
from hybridflow.workers.sequences import forward_response
from tests.support.agent_fakes import ScriptedEnv

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "model_type": "llama",
        "max_position_embeddings": 256, "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def engine(char_tokenizer):
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    module = build_causal_lm(ModelConfig(hf_config=dict(TINY), device="cpu"), char_tokenizer,
                             cpu, 0)
    return HFEngine(module, char_tokenizer, cpu, shares_module=True)


def test_left_pad():
    out = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert out["input_ids"].tolist() == [[1, 2, 3], [0, 0, 4]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]


def test_episodes_with_a_real_model_train_on_the_tokens_it_sampled(engine, char_tokenizer):
    fed, sampled = [], []

    class Recording(EngineGenerator):
        def __call__(self, contexts, max_new_tokens):
            turns = super().__call__(contexts, max_new_tokens)
            fed.extend(map(list, contexts))
            sampled.extend(t.token_ids for t in turns)
            return turns

    generator = Recording(engine, RolloutConfig(max_new_tokens=8, temperature=1.0),
                          char_tokenizer.pad_token_id)
    rows = [{"prompt": f"{i}+{i}=", "turns": 3, "observations": [" ok ", " go "]}
            for i in range(6)]
    fmt = PlainFormat(char_tokenizer)
    result = EpisodeRunner(ScriptedEnv, generator, fmt,
                           RunnerOptions(max_turns=3, max_turn_tokens=8)).run(rows)
    batch = result.to_batch(char_tokenizer.pad_token_id)
    assert len(fed) == result.generated_rows >= 6
    for i, episode in enumerate(result.episodes):
        traj = episode.trajectory
        full, turns = traj.context_ids(), 0
        for context, ids in zip(fed, sampled):
            if full[:len(context)] == context:  # this episode's context at some turn
                assert full[len(context):len(context) + len(ids)] == ids
                turns += 1
        assert turns == traj.model_turns  # every model turn is a sampled one, unchanged
        model = batch["responses"][i][batch["loss_mask"][i].bool()].tolist()
        assert model == traj.model_token_ids()
    with torch.no_grad():
        trained, _ = forward_response(engine.module, batch)
    log_probs = trained[batch["loss_mask"].bool()]
    assert torch.isfinite(log_probs).all() and (log_probs <= 0).all()
    assert generator.reports_log_probs
    reported = batch["rollout_log_probs"][batch["loss_mask"].bool()]
    assert torch.allclose(log_probs, reported, atol=1e-4)
