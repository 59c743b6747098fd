"""`hybridflow plan --measure-device`: measure this machine as a planner device entry.

A CPU "device" is one worker process (the local runtime runs every role in one
process; the Ray runtime runs one per worker). The micro-benchmark measures,
in a few seconds:
- matmul FLOP/s at the process's torch thread count, in the dtype runs use
  (float32 on CPUs), which the entry stores as its peak `bf16_flops`;
- memory bandwidth: bytes read plus written by a large tensor copy;
- process-to-process transfer: bytes/s of a large message through a pipe
  to a child process, and the round trip of a small one (collective latency);
- operator latency: one small eager module call, the cost a tiny model pays per
  operator whatever its FLOPs.
Efficiencies are 1 where the benchmark measured the rate itself. Stateless.
"""
from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass

from .devices import GB, Device
from .efficiency import Efficiency

TRANSFER_BYTES = 32 * 1024 * 1024
COPY_ELEMENTS = 32 * 1024 * 1024  # float32: 128 MiB each way


@dataclass(frozen=True)
class Measurement:
    matmul_flops: float
    memory_bandwidth: float
    transfer_bandwidth: float
    transfer_latency_s: float
    op_latency_s: float
    threads: int

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - began)
    return best


def matmul_flops(size: int = 512, repeats: int = 5) -> float:
    import torch
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)  # warm up
    return 2 * size**3 * 4 / _best_of(lambda: [torch.mm(a, b) for _ in range(4)], repeats)


def memory_bandwidth(repeats: int = 3) -> float:
    import torch
    src, dst = torch.ones(COPY_ELEMENTS), torch.empty(COPY_ELEMENTS)
    dst.copy_(src)
    return 2 * 4 * COPY_ELEMENTS / _best_of(lambda: dst.copy_(src), repeats)


def op_latency_s(repeats: int = 200) -> float:
    import torch
    layer, x = torch.nn.Linear(16, 16), torch.randn(4, 16)
    with torch.no_grad():
        layer(x)
        return _best_of(lambda: [layer(x) for _ in range(repeats)], 3) / repeats


def _echo(conn) -> None:
    while True:
        message = conn.recv_bytes()
        if not message:
            return
        conn.send_bytes(b"k")


def transfer(repeats: int = 3) -> tuple[float, float]:
    """(bytes/s of a large message, seconds of a small round trip) to a child process."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    worker = context.Process(target=_echo, args=(child,), daemon=True)
    worker.start()
    try:
        payload = b"x" * TRANSFER_BYTES

        def send(data: bytes) -> None:
            parent.send_bytes(data)
            parent.recv_bytes()

        send(b"w")
        latency = _best_of(lambda: send(b"w"), 20)
        seconds = _best_of(lambda: send(payload), repeats)
        return TRANSFER_BYTES / max(seconds - latency, 1e-9), latency
    finally:
        parent.send_bytes(b"")
        worker.join(timeout=10)


def measure(threads: int = 1) -> Measurement:
    import torch
    torch.set_num_threads(threads)
    bandwidth, latency = transfer()
    return Measurement(matmul_flops(), memory_bandwidth(), bandwidth, latency, op_latency_s(),
                       threads)


def host_memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * GB


def device_from(measured: Measurement, name: str) -> Device:
    """A device entry: measured rates as peaks, efficiencies 1, the CPU's fixed costs."""
    efficiency = Efficiency(
        mfu_train=1.0, mfu_forward=1.0, mfu_decode=1.0, hbm_efficiency=1.0, link_efficiency=1.0,
        intra_node_latency_s=measured.transfer_latency_s,
        inter_node_latency_s=measured.transfer_latency_s, tp_efficiency_loss=0.0,
        decode_step_overhead_s=0.0, engine_switch_s=0.0,
        node_call_overhead_s=measured.transfer_latency_s, step_overhead_s=0.0,
        op_latency_s=measured.op_latency_s, host_adam_params_per_s=measured.memory_bandwidth / 32)
    label = f"CPU ({name}, {measured.threads} thread(s))"
    return Device(name, label, measured.matmul_flops, measured.memory_bandwidth,
                  host_memory_bytes(), measured.transfer_bandwidth, measured.transfer_bandwidth,
                  measured.memory_bandwidth, efficiency)
