"""The fused worker's task path (runtime/worker_shell.py): a task sent as bytes
(`encode_task`, how the Ray runtime sends it) runs as the ShardTask itself does, each
distinct blob is decoded once, and the worker keeps at most TASK_CACHE of them."""
from __future__ import annotations

import torch

from hybridflow.core.batch import Batch
from hybridflow.graph.builder import Graph
from hybridflow.graph.dispatch import DP, method
from hybridflow.plan.compiler import compile_graph
from hybridflow.plan.placement import Placement
from hybridflow.runtime import worker_shell
from hybridflow.runtime.worker_shell import (DepInput, FusedWorker, Piece, ShardTask,
                                             ShippedNode, encode_task)


class Doubler:
    def __init__(self, cfg=None, ctx=None):
        pass

    @method(dispatch=DP, reads=("x",), writes=("y",))
    def double(self, batch: Batch) -> Batch:
        return Batch({"y": batch["x"] * 2}, meta={"metrics": {"double/rows": len(batch)}})


def _worker_and_task(group_keys=()):
    g = Graph("double")
    g.call("w.double", g.source("rows", keys=("x",)))
    plan = compile_graph(g, {"w": Doubler}, Placement.single_pool({"w": Doubler}, devices=1))
    node = plan.node("w.double")
    worker = FusedWorker.in_process("pool", 0, 1, {"w": Doubler()})
    shipped = ShippedNode(node)
    worker.learn_node(shipped.digest, shipped.blob)
    task = ShardTask(shipped.digest, {"rows": DepInput((Piece(0, slice(1, 3)),))},
                     group_keys=group_keys)
    return worker, task


def test_a_task_sent_as_bytes_runs_as_the_task_itself():
    worker, task = _worker_and_task(group_keys=("y",))
    rows = Batch({"x": torch.arange(4.0)})
    out, meta = worker.run(task, rows)
    out_b, meta_b = worker.run(encode_task(task), rows)
    assert torch.equal(out_b["y"], torch.tensor([2.0, 4.0])) and torch.equal(out_b["y"], out["y"])
    assert {k: meta_b[k] for k in ("rows", "keys", "metrics")} == \
        {"rows": 2, "keys": ["y"], "metrics": {"double/rows": 2}}
    assert meta_b["groups"]["y"].tolist() == meta["groups"]["y"].tolist()


def test_each_blob_is_decoded_once_and_the_cache_is_bounded(monkeypatch):
    worker, task = _worker_and_task()
    blob = encode_task(task)
    assert worker._decode(blob) is worker._decode(bytes(blob))  # equal bytes, one task
    monkeypatch.setattr(worker_shell, "TASK_CACHE", 3)
    for i in range(5):
        worker._decode(encode_task(ShardTask(task.node, task.inputs, (f"k{i}",))))
        assert len(worker.tasks) <= 3
    assert worker._decode(task) is task  # in-process: the ShardTask as it is
