"""`hybridflow plan --measure-device`: measure this machine as a planner device entry.

A CPU "device" is one worker process (the local runtime runs every role in one
process; the Ray runtime runs one per worker). The micro-benchmark measures,
in a few seconds:
- matmul FLOP/s at the process's torch thread count, in the dtype runs use
  (float32 on CPUs), which the entry stores as its peak `bf16_flops`;
- memory bandwidth: bytes read plus written by a large tensor copy;
- process-to-process transfer: bytes/s of a large message through a pipe
  to a child process, and the round trip of a small one (collective latency);
- a tiny eager decoder (Hugging Face Llama, hidden 64, the embedded default's
  shape) at 1 and 3 layers and two batch sizes: the fixed cost of one layer's
  call (stored as OPS_PER_LAYER operator launches) and its cost per token
  (stored as the forward efficiency against the matmul peak), and the per-step
  overhead of `generate` beyond its forward (sampling, cache, stopping checks).
Efficiencies are 1 where the benchmark measured the rate itself. Stateless.
"""
from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass

from .devices import GB, Device
from .efficiency import Efficiency
from .formulas import OPS_PER_LAYER, OPS_PER_PASS

TRANSFER_BYTES = 32 * 1024 * 1024
COPY_ELEMENTS = 32 * 1024 * 1024  # float32: 128 MiB each way
REPLY_TIMEOUT_S = 30.0
TINY_HIDDEN, TINY_TOKENS = 64, 12


@dataclass(frozen=True)
class Measurement:
    matmul_flops: float
    memory_bandwidth: float
    transfer_bandwidth: float
    transfer_latency_s: float
    op_latency_s: float
    threads: int
    layer_token_flops: float = 0.0  # FLOP/s one eager layer reaches per token at the tiny shape
    decode_step_overhead_s: float = 0.0

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
    """fp32 matmul FLOP/s: the measurement the workers report `perf/mfu` against."""
    from hybridflow.core.device_peak import matmul_flops as measured
    return measured(size=size, repeats=repeats)


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
    methods = multiprocessing.get_all_start_methods()  # fork: the child needs nothing imported
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    parent, child = context.Pipe()
    worker = context.Process(target=_echo, args=(child,), daemon=True)
    worker.start()
    try:
        payload = b"x" * TRANSFER_BYTES

        def send(data: bytes) -> None:
            parent.send_bytes(data)
            if not parent.poll(REPLY_TIMEOUT_S):
                raise RuntimeError("the transfer benchmark's child process did not answer "
                                   f"within {REPLY_TIMEOUT_S:.0f} s")
            parent.recv_bytes()

        send(b"w")
        latency = _best_of(lambda: send(b"w"), 20)
        seconds = _best_of(lambda: send(payload), repeats)
        return TRANSFER_BYTES / max(seconds - latency, 1e-9), latency
    finally:
        parent.send_bytes(b"")
        worker.join(timeout=10)
        if worker.is_alive():
            worker.terminate()


def tiny_decoder(layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=TINY_HIDDEN, intermediate_size=2 * TINY_HIDDEN,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=80, pad_token_id=0, eos_token_id=2, bos_token_id=1)
    return LlamaForCausalLM(config).eval()


def eager_layer_costs() -> tuple[float, float, float]:
    """(seconds per layer call, seconds per layer-token, generate overhead per decode step)."""
    import torch
    models = {layers: tiny_decoder(layers) for layers in (1, 3)}
    per_layer = {}
    with torch.no_grad():
        for rows in (16, 64):
            x = torch.randint(3, 80, (rows, TINY_TOKENS))
            fwd = {n: _best_of(lambda m=m, x=x: m(x), 5) for n, m in models.items()}
            per_layer[rows] = max((fwd[3] - fwd[1]) / 2, 1e-7)
        per_token = max((per_layer[64] - per_layer[16]) / (48 * TINY_TOKENS), 1e-10)
        call = max(per_layer[16] - 16 * TINY_TOKENS * per_token, 1e-7)
        x = torch.randint(3, 80, (64, TINY_TOKENS))

        def generate(new: int):
            return lambda: models[1].generate(x, attention_mask=torch.ones_like(x),
                                              max_new_tokens=new, min_new_tokens=new,
                                              do_sample=True)
        step = (_best_of(generate(5), 3) - _best_of(generate(1), 3)) / 4
    forward = 1 * (call + 64 * per_token) + OPS_PER_PASS * (call / OPS_PER_LAYER)
    return call, per_token, max(step - forward, 0.0)


def measure(threads: int = 1) -> Measurement:
    import torch
    torch.set_num_threads(threads)
    bandwidth, latency = transfer()
    call, per_token, decode_overhead = eager_layer_costs()
    flops_per_layer_token = 2 * (4 * TINY_HIDDEN**2 + 3 * TINY_HIDDEN * 2 * TINY_HIDDEN)
    return Measurement(matmul_flops(), memory_bandwidth(), bandwidth, latency,
                       call / OPS_PER_LAYER, threads, flops_per_layer_token / per_token,
                       decode_overhead)


def host_memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 16 * GB


def device_from(measured: Measurement, name: str) -> Device:
    """A device entry: measured rates as peaks, efficiencies 1, the CPU's fixed costs."""
    small = min(1.0, measured.layer_token_flops / measured.matmul_flops) or 1.0
    efficiency = Efficiency(
        mfu_train=small, mfu_forward=small, mfu_decode=small, hbm_efficiency=1.0,
        link_efficiency=1.0,
        intra_node_latency_s=measured.transfer_latency_s,
        inter_node_latency_s=measured.transfer_latency_s, tp_efficiency_loss=0.0,
        decode_step_overhead_s=measured.decode_step_overhead_s, engine_switch_s=0.0,
        node_call_overhead_s=measured.transfer_latency_s, step_overhead_s=0.0,
        op_latency_s=measured.op_latency_s, host_adam_params_per_s=measured.memory_bandwidth / 32)
    label = f"CPU ({name}, {measured.threads} thread(s))"
    return Device(name, label, measured.matmul_flops, measured.memory_bandwidth,
                  host_memory_bytes(), measured.transfer_bandwidth, measured.transfer_bandwidth,
                  measured.memory_bandwidth, efficiency, cpu=True)
