"""Ray runtime on a 2-node cluster (ray.cluster_utils.Cluster, 2 logical GPUs per
node): one placement group per node of a pool, ranks 0-1 on one node and 2-3 on the
other, and all four in one torch.distributed world (gloo)."""
from __future__ import annotations

import time

import pytest
import ray
from ray import cloudpickle

from tests.support import runtime_fakes as fakes
from hybridflow.plan.placement import Placement, PoolSpec
from hybridflow.runtime.ray.executor import RayRuntime

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # ~20 s: two raylets


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster
    cloudpickle.register_pickle_by_value(fakes)
    if ray.is_initialized():
        ray.shutdown()
    start = time.time()
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "num_gpus": 2})
    nodes.add_node(num_cpus=3, num_gpus=2)
    ray.init(address=nodes.address)
    nodes.wait_for_nodes()
    yield time.time() - start
    ray.shutdown()
    nodes.shutdown()


def test_two_node_pool_places_ranks_by_node_and_forms_one_world(cluster):
    placement = Placement({"wide": PoolSpec("wide", nodes=2, devices_per_node=2)},
                          {"echo": "wide"})
    from hybridflow.plan.compiler import compile_graph
    plan = compile_graph(fakes.call_graph("echo.allreduce"), fakes.ECHO_BINDINGS, placement)
    rt = RayRuntime(plan, {"runtime": {"call_timeout_s": 120}})
    try:
        info = rt.worker_info("wide")
        nodes = [i["node_id"] for i in info]
        assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
        assert [i["env"]["RANK"] for i in info] == ["0", "1", "2", "3"]
        assert [i["env"]["LOCAL_RANK"] for i in info] == ["0", "1", "0", "1"]
        assert len({(i["env"]["MASTER_ADDR"], i["env"]["MASTER_PORT"]) for i in info}) == 1
        assert [len(i["env"]["CUDA_VISIBLE_DEVICES"].split(",")) for i in info] == [2] * 4
        result = rt.run_step({"prompts": fakes.prompts(8)})
        assert rt.fetch(result, "echo.allreduce", ["y"])["y"].tolist() == [10] * 8
    finally:
        rt.shutdown()
