"""What every benchmark shares: the machine it ran on, alternated timing, medians,
tables and the JSON file under bench/results/.

Machines here are shared and noisy, so a benchmark never times one variant for a
while and then the next: `alternate` runs one repetition of each variant in turn
(rotating who goes first), and results are read as ratios taken in the same run.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from typing import Callable

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

__all__ = ["machine", "set_threads", "alternate", "median", "table", "write_results",
           "peak_rss_bytes", "rss_bytes", "reset_peak_rss", "need_real_model", "RESULTS",
           "free_port", "leave_group"]


def set_threads(n: int) -> int:
    """Pin torch's intra-op threads (the default follows the core count, which on a
    shared machine makes timings depend on who else is running)."""
    import torch
    torch.set_num_threads(n)
    return torch.get_num_threads()


def machine() -> dict:
    import torch
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "platform": platform.platform(), "load_avg_1m_at_start": load,
            # the vector ISA torch's kernels use: bf16 is fast only with AVX-512 bf16/AMX
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_vector_flags": _vector_flags()}


def quiet_logs() -> None:
    """Warnings, transformers' and Ray's info logs and progress bars off: a bench's
    table is its output."""
    import logging
    import warnings
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("ray").setLevel(logging.WARNING)


def _vector_flags() -> list[str]:
    """The AVX/AMX flags /proc/cpuinfo reports (what the VM exposes, not the chip)."""
    try:
        with open("/proc/cpuinfo") as handle:
            flags = next(line.split(":", 1)[1].split() for line in handle
                         if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags if f.startswith(("avx", "amx")))


def alternate(variants: dict[str, Callable[[], object]], reps: int,
              warmup: int = 0) -> dict[str, list[float]]:
    """Seconds per call of each variant, `reps` times each, one of each in turn
    (the first variant rotates every round, so none always runs after the same one)."""
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(reps):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def peak_rss_bytes(pid: int | str = "self") -> int:
    """The peak resident set size (VmHWM) of a process, in bytes."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]

    def line(items):
        return "| " + " | ".join(s.rjust(w) for s, w in zip(items, widths)) + " |"
    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    return "\n".join(out + [line(r) for r in cells])


def _fmt(value) -> str:
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return "-" if value is None else str(value)


def write_results(name: str, payload: dict, out: str | None = None) -> str:
    path = out or os.path.join(RESULTS, f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(payload, handle, indent=1, default=str)
    return path


def rss_bytes(pid: int | str = "self") -> int:
    """The resident set size (VmRSS) of a process now, in bytes."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux: `5` to clear_refs), so
    `peak_rss_bytes()` after a call is that call's peak; False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


_MAKE_MODEL = "`hybridflow model smollm2 --out DIR` makes it"
_MAKE_DATA = "`hybridflow data word_arith --out DIR` makes it"


def need_real_model(parser, model: str | None, data: str | None = None,
                    data_needed: bool = False) -> None:
    """Stop a real-model bench before it loads anything when its inputs are missing.

    The model comes from --model or HYBRIDFLOW_SMOLLM2_DIR (CI sets the variable), so
    each path is checked for what the bench will read, not only for being given."""
    if not model:
        parser.error(f"--model (or HYBRIDFLOW_SMOLLM2_DIR) is needed: {_MAKE_MODEL}")
    if not os.path.isfile(os.path.join(model, "config.json")):
        parser.error(f"--model {model}: no config.json there (an HF model directory is "
                     f"needed): {_MAKE_MODEL}")
    if data_needed and not data:
        parser.error(f"--data is needed (a folder with train.jsonl, test.jsonl): {_MAKE_DATA}")
    if data is None:
        return
    missing = [f for f in ("train.jsonl", "test.jsonl")
               if not os.path.isfile(os.path.join(data, f))]
    if missing:
        parser.error(f"--data {data}: no {' or '.join(missing)} there: {_MAKE_DATA}")


def free_port() -> int:
    """A TCP port free now on 127.0.0.1, for a spawned process group's store."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def leave_group(rank: int, world: int, out_dir: str, timeout_s: float = 60.0) -> None:
    """Leave the default process group, rank 0 (the TCP store's host) last: the others
    mark `out_dir/left<rank>` once gone, and rank 0 waits for them (up to `timeout_s`)."""
    import torch.distributed as dist
    dist.barrier()
    if rank:
        dist.destroy_process_group()
        open(os.path.join(out_dir, f"left{rank}"), "w").close()
        return
    deadline = time.monotonic() + timeout_s
    others = [os.path.join(out_dir, f"left{r}") for r in range(1, world)]
    while time.monotonic() < deadline and not all(os.path.exists(p) for p in others):
        time.sleep(0.05)
    dist.destroy_process_group()
