"""GRPO with rollout.backend=vllm end to end, against real vLLM (the CPU build, in the
environment .ci/vllm.sh builds; skipped without vLLM): runs with validation on and the
rollout on its own pool (two engines in one process and the weight-sync edge), and
learns the toy task colocated and split, on the local runtime and on Ray."""
import pytest

pytest.importorskip("vllm")

from tests.support.e2e import series, train
from tests.support.vllm_real import VLLM_RUN

pytestmark = pytest.mark.vllm

VAL = "val/toy_arith/greedy"
SPLIT = ("placement.pools.gen.devices_per_node=1", "placement.roles.rollout=gen")
HEAD32 = ("model.path=null", "model.hf_config.num_attention_heads=2",
          "model.hf_config.num_key_value_heads=1", "model.hf_config.head_dim=32")


def test_split_rollout_with_validation_builds_two_engines_and_syncs(tmp_path):
    """The rollout's own engine generates, validation's actor.generate builds a second
    one in the same process (a fixed port failed there: EADDRINUSE), and the weight-sync
    edge loads every update into the rollout's engine."""
    trainer, metrics = train("grpo", tmp_path, *VLLM_RUN, *SPLIT, *HEAD32, "trainer.steps=2",
                             "trainer.val_every=1", "trainer.val_samples=1",
                             "data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=8",
                             "actor.micro_batch_size=8")
    assert trainer.run.status()["state"] == "finished"
    assert len(series(metrics, VAL)) >= 2
    assert series(metrics, "rollout/policy_version")[-1] >= 1  # synced after the update
    assert all(v == 0 for v in series(metrics, "rollout/probs_diff_max")[:1]) or \
        series(metrics, "rollout/probs_diff_max")[0] < 1e-3


LEARN = ("trainer.steps=12", "trainer.val_every=12", "trainer.val_samples=1",
         "rollout.max_model_len=64")


def _learns(metrics):
    accuracy = series(metrics, VAL)
    assert accuracy[0] <= 0.2 and accuracy[-1] >= 0.9, accuracy


@pytest.mark.slow  # a 12-step training run
@pytest.mark.parametrize("placement", [(), SPLIT], ids=["colocated", "split"])
def test_grpo_with_vllm_learns_locally(tmp_path, placement):
    _, metrics = train("grpo", tmp_path, *VLLM_RUN, *LEARN, *placement)
    _learns(metrics)


@pytest.mark.slow  # a training run on Ray, 2 data-parallel ranks
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("placement", [("placement.pools.main.devices_per_node=2",),
                                       ("placement.pools.main.devices_per_node=2",
                                        "placement.pools.gen.devices_per_node=2",
                                        "placement.roles.rollout=gen")],
                         ids=["colocated_2dp", "split_2dp"])
def test_grpo_with_vllm_learns_on_ray(tmp_path, placement):
    _, metrics = train("grpo", tmp_path, *VLLM_RUN, *LEARN, "runtime.name=ray",
                       "runtime.torch_threads=1", *placement)
    _learns(metrics)
