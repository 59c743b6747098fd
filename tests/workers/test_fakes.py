"""The shared fake roles (tests/support/fakes.py) carry the real workers' contracts,
so graphs that compile against them compile against the real roles, and they run
the shipped graphs' steps without a model."""
from __future__ import annotations

import os

import pytest
import torch

from hybridflow.program.assemble import prepare
from hybridflow.graph.dispatch import method, worker_methods
from hybridflow.runtime.local import LocalRuntime
from tests.support import fakes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKES_FILE = os.path.join(REPO, "tests", "support", "fakes.py")


@pytest.mark.parametrize("fake", list(fakes.FAKE_ROLES.values()), ids=list(fakes.FAKE_ROLES))
def test_every_fake_method_has_the_real_contract(fake):
    real = worker_methods(fake.REAL)
    mine = worker_methods(fake)
    assert mine, fake
    for name, spec in mine.items():
        assert spec == real[name], (fake.__name__, name)


def test_the_fakes_cover_the_rl_methods_of_every_role():
    covered = {(role, m) for role, fake in fakes.FAKE_ROLES.items() for m in worker_methods(fake)}
    assert {("actor", "generate"), ("actor", "logprob"), ("actor", "update"),
            ("ref", "logprob"), ("critic", "values"), ("critic", "update"),
            ("reward", "score")} <= covered


def test_a_fake_follows_a_changed_declaration():
    class Worker:
        @method(reads=("a", "b"), writes=("c",), kind="inference")
        def score(self, batch, scale: float = 1.0): ...

    class Fake:
        @fakes.declared_as(Worker, "score")
        def score(self, batch, **_): ...

    spec = worker_methods(Fake)["score"]
    assert spec.reads == ("a", "b") and spec.writes == ("c",) and spec.params == ("scale",)


def test_declaring_an_undeclared_method_is_refused():
    with pytest.raises(TypeError, match="ActorWorker.save is not a declared worker method"):
        fakes.declared_as(fakes.ActorWorker, "save")


@pytest.mark.parametrize("graph", ["grpo", "ppo"])
def test_a_shipped_graph_runs_one_step_on_the_fakes(graph, tmp_path):
    bindings = [f"workers.{role}={FAKES_FILE}:{cls.__name__}"
                for role, cls in fakes.FAKE_ROLES.items()]
    loaded = prepare(os.path.join(REPO, "graphs", f"{graph}.py"),
                     [f"trainer.runs_dir={tmp_path}", *bindings])
    runtime = LocalRuntime(loaded.plan, loaded.cfg)
    try:
        result = runtime.run_step({"prompts": fakes.fake_prompts(3)})
    finally:
        runtime.shutdown()
    # the real rollout role, colocated, generates through the (fake) actor
    n, rollout = loaded.cfg.rollout.n, result.outputs["rollout.generate"]
    assert rollout["responses"].shape == (3 * n, fakes.RESPONSE_LENGTH)
    assert list(rollout["uid"]) == [f"u{i}" for i in range(3) for _ in range(n)]
    assert torch.equal(rollout["input_ids"][:, :3], rollout["prompts"])
    assert result.metrics["actor/updates"] == 1.0
