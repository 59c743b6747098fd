"""DAPO's gather on the local runtime: extra rounds drawn for one step concatenate even
when their prompts are of different lengths."""
from __future__ import annotations

import json

from tests.support.e2e import series, train

# every response scores 0 on sums under 10 (a uniform group, dropped), else 0 or 1
SCORER = '''
import zlib
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if int(ground_truth) < 10:
        return 0.0
    return float(zlib.crc32(solution_str.encode()) % 2)
'''


def test_gather_rounds_with_longer_prompts_concatenate(tmp_path):
    data, scorer = tmp_path / "train.jsonl", tmp_path / "scorer.py"
    pairs = [(1, 2), (2, 3), (3, 4), (1, 1)] + [(100 + i, 5) for i in range(12)]
    data.write_text("".join(json.dumps({"data_source": "toy_arith", "prompt": f"{a}+{b}=",
                                        "reward_model": {"ground_truth": str(a + b)}}) + "\n"
                            for a, b in pairs))
    scorer.write_text(SCORER)
    # the first batch (short prompts) is dropped whole; round 2 draws longer prompts
    _, metrics = train("dapo", tmp_path, f"data.train_files={data}", "data.shuffle=false",
                       f"reward.function_path={scorer}", "data.max_prompt_length=16",
                       "data.batch_size=4", "rollout.n=4", "actor.mini_batch_size=16",
                       "actor.micro_batch_size=16", "algorithm.overlong_buffer=0",
                       "trainer.steps=1", "trainer.val_every=0")
    assert series(metrics, "gather/extra_rounds")[0] >= 1.0
    assert series(metrics, "gather/rows") == [16.0]
