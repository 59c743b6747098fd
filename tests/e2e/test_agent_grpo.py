"""graphs/agent_grpo.py end to end: on the local runtime, from the shipped tool-using
base checkpoint, GRPO over calculator episodes raises held-out greedy accuracy (played
with the tool) from at most 0.5 to at least 0.9, and logs the agent metrics; on the
Ray runtime (logical GPUs) a few steps run, the agent role plays in the actor's worker
process, validation plays greedy episodes, and the agent metrics are logged."""
import pytest

from tests.support.e2e import series, train

VAL = "val/toy_calc/greedy"
AGENT_METRICS = ("agent/turns/mean", "agent/tool_calls/mean", "agent/tool_errors_total",
                 "agent/env_timeouts_total")


@pytest.mark.slow  # a training run (about a minute on a quiet 2-core machine)
def test_agent_grpo_learns_to_use_the_tool(tmp_path):
    trainer, metrics = train("agent_grpo", tmp_path, "trainer.steps=20", "trainer.val_every=10")
    accuracy = series(metrics, VAL)
    assert accuracy[0] <= 0.5 and accuracy[-1] >= 0.9, accuracy
    calls = series(metrics, "agent/tool_calls/mean")
    assert calls[-1] > calls[0], calls  # it learned to call the tool, not to add
    for key in AGENT_METRICS:
        assert key in metrics[-1], key
    assert trainer.run.status()["state"] == "finished"


@pytest.mark.slow  # a training run on Ray
@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_agent_grpo_runs_on_ray(tmp_path):
    trainer, metrics = train("agent_grpo", tmp_path, "runtime.name=ray", "trainer.steps=2",
                             "trainer.val_every=2", "runtime.torch_threads=1",
                             "data.batch_size=8", "rollout.n=4",
                             "actor.mini_batch_size=32", "actor.micro_batch_size=32")
    last = metrics[-1]
    for key in (*AGENT_METRICS, "actor/pg_loss", VAL):
        assert key in last, key
    assert last["agent/episodes_total"] == 32  # 8 prompts x n=4
    assert last["agent/env_errors_total"] == 0
    assert trainer.run.status()["state"] == "finished"
