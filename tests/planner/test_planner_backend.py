"""Training backends: FSDP re-gathers vs Megatron model parallel, and CPU offload."""
import pytest
from planner_graphs import PAPER_WORKLOAD, a100, ppo_graph, same_size

from hybridflow.planner import NoFeasiblePlacement, TrainingBackend, plan_placement
from hybridflow.planner.cost import CostModel
from hybridflow.planner.problem import PlanningError, build_problem

ROLES = ("actor", "ref", "critic", "reward")


def cost(size, devices, backend=None, workload=PAPER_WORKLOAD):
    return CostModel(build_problem(ppo_graph(), a100(devices), same_size(size, ROLES), workload,
                                   backend))


def test_offloading_the_optimizer_shrinks_resident_state_and_adds_host_time():
    plain, offload = cost("13b", 16), cost("13b", 16, TrainingBackend(offload="optimizer"))
    assert offload.static_bytes("critic", 16) == pytest.approx(plain.static_bytes("critic", 16) / 4)
    assert offload.static_bytes("ref", 16) == plain.static_bytes("ref", 16)  # frozen: unchanged
    update = "critic.update"
    assert (offload.role_cost("critic", 16, 1).node_seconds[update]
            > plain.role_cost("critic", 16, 1).node_seconds[update])


def test_offload_makes_70b_ppo_fit_on_32_devices():
    with pytest.raises(NoFeasiblePlacement):
        plan_placement(ppo_graph(), a100(32), same_size("70b", ROLES), PAPER_WORKLOAD)
    result = plan_placement(ppo_graph(), a100(32), same_size("70b", ROLES), PAPER_WORKLOAD,
                            backend=TrainingBackend(offload="all"))
    for pool in result.best.pools:
        assert pool.memory.total <= pool.memory.usable


def test_megatron_does_not_regather_weights_so_small_micro_batches_cost_less():
    """FSDP pays 3 weight gathers per micro-batch; tp x pp model parallel pays none."""
    import dataclasses
    small = dataclasses.replace(PAPER_WORKLOAD, micro_batch_tokens=2048)

    def update(backend, workload):
        return cost("13b", 64, backend, workload).role_cost("critic", 64, 1).node_seconds[
            "critic.update"]

    fsdp = TrainingBackend()
    megatron = TrainingBackend("megatron", tp=4, pp=1)
    assert update(fsdp, small) > 1.3 * update(fsdp, PAPER_WORKLOAD)  # gather-bound
    assert update(megatron, small) < 1.1 * update(megatron, PAPER_WORKLOAD)
    assert update(megatron, small) < update(fsdp, small)


def test_megatron_shards_weights_by_model_parallel_and_optimizer_by_data_parallel():
    megatron = cost("13b", 16, TrainingBackend("megatron", tp=4, pp=2))
    params = megatron.problem.models["critic"].params
    assert megatron.static_bytes("critic", 16) == pytest.approx(4 * params / 8 + 12 * params / 16)
    assert megatron.static_bytes("ref", 16) == pytest.approx(2 * params / 8)


def test_bad_backends_are_actionable_errors():
    with pytest.raises(PlanningError, match="megatron"):
        TrainingBackend("fsdp", tp=2)
    with pytest.raises(PlanningError, match="offload"):
        TrainingBackend(offload="disk")
