"""What docs/functions.md promises about function nodes: `@node_fn` on a class
declares a stateful callable (its `__call__` is the node, `state_dict` makes it
checkpointed); `monitor=True` marks a node whose output nobody consumes on purpose;
`response_loss_mask` turns a rollout into `actor.sft` input."""
from __future__ import annotations

import torch

from hybridflow import Batch, Graph, node_fn
from hybridflow.plan.compiler import compile_graph
from hybridflow.graph.builder import fn_spec
from hybridflow.plan.placement import Placement
from hybridflow.runtime.local import LocalRuntime


@node_fn(reads=("scores",), writes=("scores",), overwrites=("scores",), rows=True)
class RunningNormaliser:
    """Scores minus their running mean over steps: state across steps."""

    def __init__(self, momentum: float = 0.5):
        self.momentum, self.mean = momentum, 0.0

    def __call__(self, batch: Batch, scale: float = 1.0) -> Batch:
        scores = batch["scores"].float()
        self.mean = self.momentum * self.mean + (1 - self.momentum) * float(scores.mean())
        return Batch({"scores": (scores - self.mean) * scale})

    def state_dict(self) -> dict:
        return {"mean": self.mean}

    def load_state_dict(self, state: dict) -> None:
        self.mean = state["mean"]


def _graph(norm, monitor=False) -> Graph:
    g = Graph("g")
    p = g.source("prompts", keys=("scores", "uid"))
    g.fn(norm, p, scale=2.0, monitor=monitor)
    return g


def test_node_fn_on_a_class_declares_each_instance_with_its_call_arguments():
    norm = RunningNormaliser()
    spec = fn_spec(norm)
    assert spec.reads == ("scores",) and spec.params == ("scale",)
    assert norm.__name__ == "running_normaliser"
    plan = compile_graph(_graph(norm), {}, Placement.single_pool({}, devices=1))
    assert [n.name for n in plan.nodes] == ["prompts", "running_normaliser"]


def test_a_stateful_class_node_keeps_its_state_across_steps():
    norm = RunningNormaliser()
    plan = compile_graph(_graph(norm), {}, Placement.single_pool({}, devices=1))
    runtime = LocalRuntime(plan, {})
    feed = {"prompts": Batch({"scores": torch.tensor([2.0, 2.0])}, {"uid": ["a", "b"]})}
    runtime.run_step(feed)
    second = runtime.run_step(feed).outputs["running_normaliser"]["scores"]
    assert norm.state_dict() == {"mean": 1.5}
    assert second.tolist() == [1.0, 1.0]  # (2 - 1.5) * 2


def test_monitor_nodes_raise_no_unused_output_warning():
    warned = compile_graph(_graph(RunningNormaliser()), {},
                           Placement.single_pool({}, devices=1)).warnings
    quiet = compile_graph(_graph(RunningNormaliser(), monitor=True), {},
                          Placement.single_pool({}, devices=1)).warnings
    assert any("consumed by no node" in w for w in warned)
    assert not any("consumed by no node" in w for w in quiet)


def test_response_loss_mask_covers_the_response_tokens_of_input_ids():
    from graphs.ops import response_loss_mask
    rollout = Batch({"prompts": torch.tensor([[0, 5, 6], [7, 8, 9]]),
                     "input_ids": torch.tensor([[0, 5, 6, 1, 2, 0], [7, 8, 9, 3, 0, 0]]),
                     "response_mask": torch.tensor([[1, 1, 0], [1, 0, 0]])})
    out = response_loss_mask(rollout)
    assert out["loss_mask"].tolist() == [[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 0, 0]]
    assert fn_spec(response_loss_mask).writes == ("loss_mask",)


@node_fn(reads=("scores",), forwards=True, group_by="uid")
def keep_correct(batch: Batch) -> Batch:
    return batch.take([i for i, s in enumerate(batch["scores"].tolist()) if s > 0])


def test_the_docs_sft_on_kept_responses_graph_compiles_and_trains_on_responses():
    from graphs.ops import response_loss_mask
    from hybridflow.workers import DEFAULT_ROLES
    g = Graph("rft")
    prompts = g.source("prompts")
    rollout = g.call("actor.generate", prompts, n=4)
    score = g.call("reward.score", rollout)
    good = g.fn(keep_correct, rollout, score)
    mask = g.fn(response_loss_mask, good)
    g.call("actor.sft", good, mask)
    plan = compile_graph(g, DEFAULT_ROLES, Placement.single_pool(DEFAULT_ROLES, devices=1))
    sft = plan.node("actor.sft")
    assert sft.input_keys["loss_mask"] == "response_loss_mask"
    assert sft.input_keys["input_ids"] == "actor.generate"
    assert not plan.warnings
