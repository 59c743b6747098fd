"""graphs/agent_grpo.py on the Ray runtime (logical GPUs): a few steps run, the agent
role plays in the actor's worker process, validation plays greedy episodes, and the
agent metrics are logged."""
import pytest

from tests.support.e2e import train

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_session")]


@pytest.mark.slow  # a training run on Ray
def test_agent_grpo_runs_on_ray(tmp_path):
    trainer, metrics = train("agent_grpo", tmp_path, "runtime.name=ray", "trainer.steps=2",
                             "trainer.val_every=2", "runtime.torch_threads=1",
                             "data.batch_size=8", "rollout.n=4",
                             "actor.mini_batch_size=32", "actor.micro_batch_size=32")
    last = metrics[-1]
    for key in ("agent/turns/mean", "agent/tool_calls/mean", "agent/tool_errors_total",
                "agent/env_timeouts_total", "actor/pg_loss", "val/toy_calc/greedy"):
        assert key in last, key
    assert last["agent/episodes_total"] == 32  # 8 prompts x n=4
    assert last["agent/env_errors_total"] == 0
    assert trainer.run.status()["state"] == "finished"
