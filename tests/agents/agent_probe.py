"""A one-node agent graph (`agent.play` then `actor.logprob`) on the calculator task,
and the overrides that run it: shared by the agent role's tests."""
import textwrap

from graphs.envs import calculator
from graphs.envs.calculator_sft import write_data

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


def probe_overrides(tmp_path, runtime_name="local"):
    """(the probe graph's file, the overrides of a one-step run of it on the calculator
    task) for `runtime_name`."""
    train, _ = write_data(str(tmp_path / "data"), n_train=8, n_test=4, seed=0)
    (tmp_path / "agent_probe.py").write_text(textwrap.dedent(GRAPH))
    return str(tmp_path / "agent_probe.py"), [
        f"trainer.runs_dir={tmp_path}", "trainer.progress=false", "trainer.steps=1",
        "trainer.val_every=0", f"data.train_files={train}", "data.max_prompt_length=16",
        "data.batch_size=4", "rollout.n=2", *ON[runtime_name], "actor.mini_batch_size=8",
        "workers.agent=hybridflow.agents.worker:AgentRolloutWorker",
        f"agent.env={calculator.__file__}:make_env", "agent.max_turns=2",
        "agent.max_turn_tokens=8", "agent.max_response_tokens=32"]
