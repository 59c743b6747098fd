"""The matmul peak of this process's device: what a phase's achieved FLOP rate is
reported against (`perf/mfu/<node>`, workers/mfu.py), and what `hybridflow plan
--measure-device` stores as a CPU's peak (planner/measure.py).

No table of vendor peaks: the peak is measured, a short matmul at a representative
size in the dtype the phase computes in, best of a few repeats (about 0.1 s on a
CPU at fp32). On a CPU whose bf16 is emulated the bf16 peak is measured as low as it
is, so a bf16 phase's ratio stays honest. On a CPU the best of two GEMM kernels is
the peak: torch's `mm` and oneDNN's with its weight prepacked (what vLLM's CPU build
and torch.compile call). They differ: on a 2-core AMD EPYC (Zen 5) at one thread,
fp32 `mm` (MKL) reached ~107 GFLOP/s and oneDNN ~2x that (docs/benchmarks.md), and
a peak of `mm` alone read vLLM's generation at 1.4x "the peak".

State: `_PEAKS`, the measured FLOP/s by (device type, index, dtype, torch threads),
filled once per process on first use; nothing else changes it.
"""
from __future__ import annotations

import time

__all__ = ["matmul_flops", "device_peak", "PEAK_SIZE"]

PEAK_SIZE = 512  # square matmul side: big enough to reach the BLAS kernel's rate
_PEAKS: dict[tuple, float] = {}


def _best_seconds(fn, repeats: int, sync) -> float:
    best = float("inf")
    for _ in range(repeats):
        sync()
        began = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - began)
    return best


def matmul_flops(size: int = PEAK_SIZE, repeats: int = 5, dtype=None, device=None,
                 per_repeat: int = 4) -> float:
    """FLOP/s of `per_repeat` (size x size) @ (size x size) matmuls, best of `repeats`."""
    import torch
    dtype = dtype or torch.float32
    device = torch.device(device or "cpu")
    # A generator of its own: the global RNG is the run's (seeded sampling), and a
    # measurement made once per process must not shift what a later run draws.
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, generator=gen).to(dtype)
    b = torch.randn(size, size, device=device, generator=gen).to(dtype)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    kernels = [torch.mm] + ([_onednn_mm(b, size)] if device.type == "cpu" else [])
    best = float("inf")
    for mm in filter(None, kernels):
        mm(a, b)  # warm up (kernel selection, page faults)
        best = min(best, _best_seconds(lambda mm=mm: [mm(a, b) for _ in range(per_repeat)],
                                       repeats, sync))
    return 2 * size**3 * per_repeat / best


def _onednn_mm(b, rows: int):
    """a @ b through oneDNN's linear with `b` prepacked, or None where this torch has
    no oneDNN (or it refuses the dtype)."""
    import torch
    try:
        weight = b.t().contiguous()  # linear's (out, in)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        linear = torch.ops.mkldnn._linear_pointwise
        linear(b.new_zeros(rows, b.shape[0]), packed, None, "none", [], "")
    except (AttributeError, RuntimeError, NotImplementedError):
        return None
    return lambda a, _: linear(a, packed, None, "none", [], "")


def device_peak(device=None, dtype=None) -> float:
    """This process's measured matmul FLOP/s on `device` in `dtype`, measured once."""
    import torch
    device = torch.device(device or "cpu")
    dtype = dtype or torch.float32
    key = (device.type, device.index, str(dtype), torch.get_num_threads())
    if key not in _PEAKS:
        _PEAKS[key] = matmul_flops(dtype=dtype, device=device,
                                   size=PEAK_SIZE * (8 if device.type == "cuda" else 1))
    return _PEAKS[key]
