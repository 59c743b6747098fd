"""`agent.play` on the Ray runtime: the agent role folds onto the actor's worker
process there too, loads the environment file in that process, and plays episodes."""
import textwrap

import pytest

from graphs.envs import calculator
from graphs.envs.calculator_sft import write_data
from hybridflow.run.loop import Trainer
from hybridflow.program.assemble import prepare
from hybridflow.run.tracking import new_run_dir

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # a Ray session and a training step

GRAPH = '''
from hybridflow import Graph


def build(cfg):
    g = Graph("agent_probe_ray")
    episodes = g.call("agent.play", g.source("prompts"), n=cfg.rollout.n)
    g.call("actor.logprob", episodes)
    return g
'''


def test_agent_play_runs_on_ray(tmp_path):
    train, _ = write_data(str(tmp_path / "data"), n_train=8, n_test=4, seed=0)
    (tmp_path / "agent_probe_ray.py").write_text(textwrap.dedent(GRAPH))
    loaded = prepare(str(tmp_path / "agent_probe_ray.py"), [
        f"trainer.runs_dir={tmp_path}", "trainer.progress=false", "trainer.steps=1",
        "trainer.val_every=0", f"data.train_files={train}", "data.max_prompt_length=16",
        "data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=8",
        "runtime.name=ray", "runtime.num_cpus=4", "runtime.call_timeout_s=300",
        "workers.agent=hybridflow.agents.worker:AgentRolloutWorker",
        f"agent.env={calculator.__file__}:make_env", "agent.max_turns=2",
        "agent.max_turn_tokens=8", "agent.max_response_tokens=32"])
    run = new_run_dir(str(tmp_path), loaded.graph.name)
    trainer = Trainer(loaded, run)
    try:
        trainer.fit()
    finally:
        trainer.close()
    metrics = run.read_metrics()[-1]
    assert metrics["agent/episodes_total"] == 8
    assert "timing_s/agent.play" in metrics
