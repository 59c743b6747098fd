"""The memory model with LoRA: the reference costs no weights, the actor's optimizer
state covers only its adapters."""
import dataclasses

import pytest
from planner_graphs import PAPER_WORKLOAD, ppo_graph, same_size

from hybridflow.planner import Cluster, ModelSpec
from hybridflow.planner.cost import CostModel
from hybridflow.planner.problem import build_problem


def test_a_lora_reference_holds_no_weights_and_the_actor_trains_only_adapters():
    spec = ModelSpec.from_name("7b")
    lora = dataclasses.replace(spec, lora_rank=8)
    models = {**same_size("7b"), "actor": lora, "ref": lora}
    cost = CostModel(build_problem(ppo_graph(), Cluster(1, 8, "a100-80g"), models,
                                   PAPER_WORKLOAD))
    assert cost.static_bytes("ref", 8) == 0.0
    assert lora.lora_params == 8 * 32 * (6 * 4096 + 2 * 4096)  # q, k, v, o of Llama-2 7B
    assert cost.static_bytes("actor", 8) == pytest.approx(
        (2 * spec.params + 16 * lora.lora_params) / 8)
    assert cost.static_bytes("actor", 8) < cost.static_bytes("critic", 8) / 7
