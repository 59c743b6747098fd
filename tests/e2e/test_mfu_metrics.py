"""Every model node of a toy run reports its FLOP rate against this machine's measured
matmul peak as `perf/mfu/<node>` (workers/mfu.py), a ratio in a sane range; no speed
is asserted."""
import pytest

from tests.support.e2e import train

MODEL_NODES = ("rollout.generate", "actor.logprob", "ref.logprob", "critic.values",
               "critic.update", "actor.update")


@pytest.mark.slow  # one PPO step on the toy model (~5 s)
def test_each_model_node_reports_its_mfu(tmp_path):
    # PPO's KL in the reward reads the old log-probs: actor.logprob stays in the plan
    _, metrics = train("ppo", tmp_path, "trainer.steps=1", "trainer.val_every=0",
                       "data.batch_size=8", "rollout.n=4", "actor.mini_batch_size=32",
                       "critic.mini_batch_size=32")
    step = metrics[-1]
    for node in MODEL_NODES:
        # no upper bound: the peak is measured once and the phase later, and a machine
        # loaded at one time and not the other gives any ratio (speed is for bench/)
        value = step[f"perf/mfu/{node}"]
        assert 0 < value < float("inf"), (node, value)
    assert "perf/mfu" not in step  # always named after its node
    reported = {k[len("perf/mfu/"):] for k in step if k.startswith("perf/mfu/")}
    assert reported == set(MODEL_NODES)  # the rule reward and the functions run no model
