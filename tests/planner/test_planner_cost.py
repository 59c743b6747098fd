"""The cost model's memory and time for one role, and the fit of a pool."""
import pytest
from planner_graphs import PAPER_WORKLOAD, a100, ppo_graph, same_size

from hybridflow.planner import Cluster, ModelSpec
from hybridflow.planner.cost import CostModel, tp_options
from hybridflow.planner.devices import GIB
from hybridflow.planner.pool import Shortfall, evaluate_pool
from hybridflow.planner.problem import build_problem


def cost_model(size="7b", devices=8, device="a100-80g"):
    cluster = Cluster(max(1, devices // 8), min(devices, 8), device)
    return CostModel(build_problem(ppo_graph(), cluster, same_size(size), PAPER_WORKLOAD))


def test_trained_state_is_16_bytes_per_param_sharded_over_the_pool():
    cost = cost_model()
    params = ModelSpec.from_name("7b").params
    assert cost.static_bytes("critic", 8) == pytest.approx(16 * params / 8)
    assert cost.static_bytes("critic", 16) == pytest.approx(cost.static_bytes("critic", 8) / 2)
    assert cost.static_bytes("ref", 8) == pytest.approx(2 * params / 8)  # frozen: bf16 weights only


def test_only_generating_roles_choose_a_tensor_parallel_size():
    cluster = a100(16)
    assert tp_options(cluster, ModelSpec.from_name("7b"), 16, generates=False) == [1]
    assert tp_options(cluster, ModelSpec.from_name("7b"), 16, generates=True) == [1, 2, 4, 8]
    # Qwen2.5-0.5B has 14 heads: tp must divide them; tp never leaves a node.
    assert tp_options(cluster, ModelSpec.from_name("0.5b"), 16, generates=True) == [1, 2]
    assert tp_options(Cluster(1, 4, "h100"), ModelSpec.from_name("7b"), 4, generates=True) == [1, 2,
                                                                                               4]


def test_generation_gets_faster_with_more_kv_memory_and_fails_without_room():
    cost = cost_model()
    tight = cost.generate_cost("actor", 8, 2, free_bytes=20 * GIB)
    roomy = cost.generate_cost("actor", 8, 2, free_bytes=60 * GIB)
    assert roomy.batch > tight.batch and roomy.waves < tight.waves
    assert roomy.seconds < tight.seconds
    no_room = cost.generate_fixed_bytes("actor", 2)
    assert cost.generate_cost("actor", 8, 2, free_bytes=no_room) is None


def test_training_scales_until_weight_gathers_dominate():
    """Few sequences per device leave FSDP gathers exposed: doubling devices stops halving
    time."""
    def update_seconds(n: int) -> float:
        return cost_model(devices=n).role_cost("critic", n, 1).node_seconds["critic.update"]
    small, mid, large = (update_seconds(n) for n in (16, 32, 128))
    assert mid == pytest.approx(small / 2, rel=0.05)  # compute-bound: near-linear
    large_64 = update_seconds(64)
    assert large > 0.6 * large_64  # comm-bound at 128: far from halving


def test_faster_devices_give_faster_steps():
    a, h = cost_model(device="a100-80g"), cost_model(device="h100-80g")
    assert h.role_cost("critic", 8, 1).node_seconds["critic.update"] < a.role_cost(
        "critic", 8, 1).node_seconds["critic.update"]


def test_pool_that_does_not_fit_reports_its_numbers():
    cost = cost_model("70b", devices=8)
    result = evaluate_pool(cost, ("actor", "ref", "critic"), 8, (8, 1, 1))
    assert isinstance(result, Shortfall)
    text = result.reason("A100-80G")
    assert "GiB per device > 72.0 GiB usable" in text
    assert "actor 128.5" in text  # 16 bytes x 69B params / 8 devices


def test_pool_that_fits_accounts_static_and_peak_memory():
    cost = cost_model("7b", devices=8)
    pool = evaluate_pool(cost, ("actor", "ref", "critic"), 8, (2, 1, 1))
    assert not isinstance(pool, Shortfall)
    assert pool.memory.total <= pool.memory.usable
    assert set(pool.memory.static) == {"actor", "ref", "critic"}
    assert pool.memory.peak_node == "actor.generate"  # the KV cache takes what is left
    assert pool.layouts["actor"].dp * pool.layouts["actor"].tp == 8
