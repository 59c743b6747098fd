"""Looking at a step's batches: `trainer.dump_batches=[1,5]` writes, after each of
those steps, every node's output batch to `RUN_DIR/batches/step_000001/<node>.pt`
(the columns the compiler says the output holds: tensors as they are, the other
columns as lists, and the node's metrics); training steps only. Read one with
`hybridflow.run.batch_dump.load_batch(path)` (or
`torch.load(path, weights_only=True)`): a dict `{"node", "step", "rows", "tensors",
"columns", "metrics"}`, e.g. to check that `loss_mask` covers only the model's tokens.
Stateless; the files are data (tensors and plain values), never code.
"""
from __future__ import annotations

import os
import re

import numpy as np
import torch

__all__ = ["dump_step", "load_batch"]


def _plain(values):
    """A non-tensor column as a list of JSON-like values (weights_only loads it)."""
    if isinstance(values, np.ndarray):
        values = values.tolist()
    return [v.tolist() if isinstance(v, np.ndarray) else v for v in values]


def dump_step(run_path: str, step: int, plan, runtime, result) -> str:
    """Write every node's output of `result` (step `step`) under the run directory;
    returns the step's folder."""
    folder = os.path.join(run_path, "batches", f"step_{step:06d}")
    os.makedirs(folder, exist_ok=True)
    for node in plan.nodes:
        out = result.outputs.get(node.name)
        if out is None:
            continue
        held = out.keys() if callable(out.keys) else (out.keys or ())  # Batch | NodeOutput
        keys = tuple(sorted(k for k in node.output_keys if k in held))
        if not keys:
            continue
        batch = runtime.fetch(result, node.name, keys)
        record = {"node": node.name, "step": step, "rows": len(batch),
                  "tensors": {k: v.detach().cpu() for k, v in batch.tensors.items()},
                  "columns": {k: _plain(v) for k, v in batch.non_tensors.items()},
                  "metrics": dict(result.node_metrics.get(node.name, {}))}
        name = re.sub(r"[^\w.-]", "_", node.name)
        torch.save(record, os.path.join(folder, f"{name}.pt"))
    return folder


def load_batch(path: str) -> dict:
    """A dumped batch (`dump_step`), read without unpickling any code."""
    from hybridflow.core.loading import read_torch
    return read_torch(path, "batch dump")
