"""`hybridflow run --address ADDR` joins an existing multi-node Ray cluster and
trains a data-parallel actor across its nodes (2 nodes x 1 logical GPU here)."""
import json
import os

import pytest

from hybridflow.cli import main
from tests.support.e2e import graph_file

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster
    if ray.is_initialized():
        ray.shutdown()
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "num_gpus": 1})
    nodes.add_node(num_cpus=3, num_gpus=1)
    nodes.wait_for_nodes()
    yield nodes
    if ray.is_initialized():
        ray.shutdown()
    nodes.shutdown()


def test_run_joins_a_cluster_by_address_and_spans_its_nodes(cluster, tmp_path):
    code = main(["run", graph_file("grpo"), "--address", cluster.address,
                 f"trainer.runs_dir={tmp_path}", "trainer.run_name=joined", "trainer.steps=2",
                 "trainer.val_every=0", "trainer.progress=false",
                 "placement.pools.main.nodes=2", "placement.pools.main.devices_per_node=1"])
    assert code == 0
    run_dir = os.path.join(tmp_path, "joined")
    assert json.load(open(os.path.join(run_dir, "status.json")))["state"] == "finished"
    ranks = {row["rank"] for row in map(json.loads, open(os.path.join(run_dir, "timeline.jsonl")))
             if row["node"] == "actor.update"}
    assert ranks == {0, 1}
