"""The agent rollout as a node: `agent.play` in a graph, run on the calculator task
beside the actor whose engine it generates with, by the local runtime and by Ray (where
the agent role folds onto the actor's worker process and loads the environment file
in that process)."""
import textwrap

import pytest

from graphs.envs import calculator
from graphs.envs.calculator_sft import write_data
from hybridflow.agents import AGENT_ROLLOUT_WRITES
from hybridflow.core.constraints import ConfigError
from hybridflow.run.loop import Trainer
from hybridflow.program.assemble import prepare
from hybridflow.run.tracking import new_run_dir

GRAPH = '''
from hybridflow import Graph


def build(cfg):
    g = Graph("agent_probe")
    episodes = g.call("agent.play", g.source("prompts"), n=cfg.rollout.n)
    g.call("actor.logprob", episodes)
    return g
'''


# What each runtime adds to the run's overrides.
ON = {"local": ("model.device=cpu",),
      "ray": ("runtime.name=ray", "runtime.num_cpus=4", "runtime.call_timeout_s=300")}


def _overrides(tmp_path, runtime_name="local"):
    train, _ = write_data(str(tmp_path / "data"), n_train=8, n_test=4, seed=0)
    (tmp_path / "agent_probe.py").write_text(textwrap.dedent(GRAPH))
    return str(tmp_path / "agent_probe.py"), [
        f"trainer.runs_dir={tmp_path}", "trainer.progress=false", "trainer.steps=1",
        "trainer.val_every=0", f"data.train_files={train}", "data.max_prompt_length=16",
        "data.batch_size=4", "rollout.n=2", *ON[runtime_name], "actor.mini_batch_size=8",
        "workers.agent=hybridflow.agents.worker:AgentRolloutWorker",
        f"agent.env={calculator.__file__}:make_env", "agent.max_turns=2",
        "agent.max_turn_tokens=8", "agent.max_response_tokens=32"]


@pytest.fixture
def overrides(tmp_path):
    return _overrides(tmp_path)


def test_agent_play_is_a_node_that_runs_episodes_beside_the_actor(tmp_path, runtime_name):
    graph, args = _overrides(tmp_path, runtime_name)
    loaded = prepare(graph, args)
    node = next(n for n in loaded.plan.nodes if n.role == "agent")
    assert set(AGENT_ROLLOUT_WRITES) <= set(node.writes)
    run = new_run_dir(str(tmp_path), loaded.graph.name)
    trainer = Trainer(loaded, run)
    try:
        trainer.fit()
    finally:
        trainer.close()
    metrics = run.read_metrics()[-1]
    assert metrics["agent/episodes_total"] == 8  # 4 prompts x n=2
    assert 1 <= metrics["agent/turns/mean"] <= 2
    assert "timing_s/agent.play" in metrics


def test_check_refuses_a_missing_environment_before_any_worker_starts(overrides):
    graph, args = overrides
    args = [a if not a.startswith("agent.env=") else "agent.env=nope.py:Env" for a in args]
    with pytest.raises(ConfigError, match="agent.env: environment 'nope.py:Env': file"):
        prepare(graph, args)
