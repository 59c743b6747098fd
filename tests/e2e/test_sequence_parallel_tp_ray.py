"""Sequence parallelism with tensor parallelism end to end on the Ray runtime, on the
CPU: GRPO with the actor at `placement.parallel.actor.sp=2` and `tp=2` on a pool of four
ranks (gloo) runs like the same seed's run at sp=1, tp=2 (dp 2 over the same ranks).
Generation ignores sp, so both runs generate at dp 2 x tp 2 the same rows on the same
ranks; the update then splits each row over an sp group of two tp groups.

The model is the toy with its 2 key/value heads duplicated into 4 (each query head gets
its own copy of the head it shared: the same function, the same learned weights), so
that sp x tp = 4 divides both head counts."""
import json
import math
import os
import shutil

import pytest

from tests.support.e2e import train

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.usefixtures("ray_session")]

TOY = os.path.join(os.path.dirname(__file__), "..", "..", "graphs", "assets", "toy_base")
FOUR_RANKS = ("runtime.name=ray", "placement.pools.main.devices_per_node=4",
              "runtime.torch_threads=1", "trainer.val_every=0", "trainer.seed=7",
              "actor.mini_batch_size=128", "trainer.keep_unneeded_passes=true",
              "trainer.steps=1", "actor.strategy=fsdp2", "placement.parallel.actor.tp=2")
# as the sp=2 run against sp=1 (tests/e2e/test_sequence_parallel_ray.py). Measured: the
# loss and entropy equal, the grad norm 1.78123249 against 1.78123248 (the gradient's
# positions summed over the sp ranks in another order)
ATOL = 1e-6
GRAD_NORM_RTOL = 1e-5
ROLLOUT_LOGPROB_ATOL = 1e-5


@pytest.fixture(scope="module")
def toy_4kv(tmp_path_factory) -> str:
    """The toy model with each key/value head repeated for its query heads."""
    from safetensors.torch import load_file, save_file
    out = tmp_path_factory.mktemp("toy_4kv")
    config = json.load(open(os.path.join(TOY, "config.json")))
    groups = config["num_attention_heads"] // config["num_key_value_heads"]
    weights = load_file(os.path.join(TOY, "model.safetensors"))
    for name, value in list(weights.items()):
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            heads = value.view(config["num_key_value_heads"], config["head_dim"], -1)
            weights[name] = heads.repeat_interleave(groups, 0).reshape(-1, value.shape[-1])
    config["num_key_value_heads"] = config["num_attention_heads"]
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"))
    json.dump(config, open(out / "config.json", "w"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOY, name), out / name)
    return str(out)


def test_grpo_with_an_sp2_x_tp2_actor_runs_like_tp2(tmp_path, toy_4kv):
    model = (f"model.path={toy_4kv}",)
    trainer, metrics = train("grpo", tmp_path / "sp2tp2", *FOUR_RANKS, *model,
                             "placement.parallel.actor.sp=2")
    assert trainer.run.status()["state"] == "finished"
    ran = {k.removeprefix("timing_s/") for k in metrics[-1] if k.startswith("timing_s/")}
    assert {"rollout.generate", "actor.logprob", "actor.update"} <= ran, sorted(ran)
    first = metrics[0]
    assert all(math.isfinite(first[k]) for k in ("actor/pg_loss", "actor/grad_norm"))
    assert first["rollout/probs_diff_max"] < ROLLOUT_LOGPROB_ATOL

    _, base = train("grpo", tmp_path / "tp2", *FOUR_RANKS, *model)
    assert trainer.plan.placement.layout("actor").describe() == "dp 1 × sp 2 × tp 2"
    assert first["critic/score/mean"] == base[0]["critic/score/mean"]  # the same rollouts
    for key in ("actor/pg_loss", "actor/entropy"):
        assert first[key] == pytest.approx(base[0][key], abs=ATOL), key
    assert first["actor/grad_norm"] == pytest.approx(base[0]["actor/grad_norm"],
                                                     rel=GRAD_NORM_RTOL)
