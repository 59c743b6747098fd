"""play_batch: a loader batch in, the rollout columns, forwarded prompt columns and
agent metrics out, n episodes per prompt."""
import torch

from hybridflow.agents import AGENT_ROLLOUT_WRITES, EpisodeRunner, PlainFormat, play_batch
from hybridflow.core.batch import Batch
from tests.support.agent_fakes import ContextGenerator, ScriptedEnv


def test_a_prompt_batch_becomes_a_rollout_batch(char_tokenizer):
    prompts = Batch({"input_ids": torch.zeros(2, 3, dtype=torch.long)},
                    {"prompt": ["1+1=", "2+2="], "uid": ["a", "b"], "turns": [1, 2],
                     "ground_truth": ["2", "4"]})
    ids = char_tokenizer.convert_tokens_to_ids(list("xyz"))
    runner = EpisodeRunner(ScriptedEnv, ContextGenerator(ids, char_tokenizer.eos_token_id,
                                                         stop_probability=1.0),
                           PlainFormat(char_tokenizer))
    out = play_batch(runner, prompts, char_tokenizer.pad_token_id, n=2, response_width=32,
                     policy_version=3)
    assert set(AGENT_ROLLOUT_WRITES) <= set(out.keys())
    assert list(out["uid"]) == ["a", "a", "b", "b"]
    assert out["responses"].shape == (4, 32)
    assert out["scores"].tolist() == [1.0] * 4
    assert out.meta["metrics"]["agent/turns/mean"] == 1.5
    assert out["policy_version"].tolist() == [3] * 4
