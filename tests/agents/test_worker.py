"""The agent rollout as a node: `agent.play` in a graph, run on the calculator task
beside the actor whose engine it generates with, by the local runtime and by Ray (where
the agent role folds onto the actor's worker process and loads the environment file
in that process)."""

import pytest
from agent_probe import probe_overrides as _overrides

from hybridflow.agents import AGENT_ROLLOUT_WRITES
from hybridflow.core.constraints import ConfigError
from hybridflow.run.loop import Trainer
from hybridflow.program.assemble import prepare
from hybridflow.run.tracking import new_run_dir

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
    with pytest.raises(ConfigError, match="agent.env: environment: file 'nope.py' does not exist"):
        prepare(graph, args)
