"""Linear layers through oneDNN with prepacked weights, for a no-grad pass on a CPU.

On some CPUs torch's `F.linear` (MKL's sgemm in the CPU wheel) runs far below what the
cores can do: on a 2-core AMD EPYC (Zen 5, AVX-512) at fp32, SmolLM2-135M's shapes ran
at 77-88 GFLOP/s a thread through `F.linear` and 150-220 through oneDNN's linear with
its weight reordered once into oneDNN's blocked layout (`torch.ops.mkldnn.
_reorder_linear_weight` + `_linear_pointwise`: the kernel vLLM's CPU build calls), at
2 threads 127-177 against 236-384 (decode-sized M=32 and prefill-sized M=1952 rows),
the results equal to ~1e-6 relative (another summation order). A reorder costs ~0.3 ms
a weight, so it pays off over a pass that reuses the weights many times: a `generate`
call, whose decode steps all run on the same weights.

`prepacked_linears(module)` packs every `nn.Linear` of a module whose weights are plain
float32 CPU tensors (no DTensor shard, no other dtype: bf16 already runs through
oneDNN) and gives each an instance `forward` calling the packed kernel; on leaving it
removes those, so the class's forward (and any later weight update) is back. The packs
are one more copy of the linear weights while the pass runs (`check --memory` counts
it in `generate`: memory/passes.generate_pass's `prepacked`). No grad: the packed kernel has no
backward, so it refuses to run under autograd.

`rollout.prepacked_linear=true` turns it on for the `hf` engine's batched `generate`
(not its stream, whose weights change between decode steps). Off by default: the
tokens and log-probs then differ from `F.linear`'s in the last bits, and on an Intel
CPU MKL is already at the oneDNN rate. Measured in docs/benchmarks.md.

Stateless: the context's packs live only inside it.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from hybridflow.core.dtensor import is_sharded

__all__ = ["prepacked_linears", "can_prepack", "ROWS_HINT"]

ROWS_HINT = 2048  # the batch size oneDNN picks the packed layout for (any M runs on it)


def can_prepack() -> bool:
    """Whether this torch has oneDNN's packed linear (a CPU build with mkldnn)."""
    ops = getattr(torch.ops, "mkldnn", None)
    try:
        return bool(torch.backends.mkldnn.is_available()) and ops is not None and \
            hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


def _packable(layer: torch.nn.Module) -> bool:
    weight = getattr(layer, "weight", None)
    if not isinstance(layer, torch.nn.Linear) or not isinstance(weight, torch.Tensor) \
            or is_sharded(weight):
        return False  # a DTensor shard (tp, FSDP2): its layer's forward gathers or reduces
    bias = layer.bias
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and \
        (bias is None or (bias.device.type == "cpu" and bias.dtype == torch.float32))


def _packed_forward(packed: torch.Tensor, bias: torch.Tensor | None):
    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("prepacked linear layers have no backward: use them "
                               "under torch.no_grad() only")
        x = x if x.is_contiguous() else x.contiguous()
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return forward


@contextmanager
def prepacked_linears(module: torch.nn.Module, enabled: bool = True,
                      rows_hint: int = ROWS_HINT):
    """Inside: `module`'s packable linear layers run oneDNN's packed kernel. Yields how
    many layers were packed (0: disabled, no oneDNN, or nothing packable)."""
    layers = [m for m in module.modules() if _packable(m)] \
        if enabled and can_prepack() else []
    patched = []
    try:
        with torch.no_grad():
            for layer in layers:
                packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(),
                                                                 rows_hint)
                bias = layer.bias.detach() if layer.bias is not None else None
                layer.forward = _packed_forward(packed, bias)
                patched.append(layer)
        yield len(patched)
    finally:
        for layer in patched:
            del layer.forward  # the instance attribute: the class's forward again
