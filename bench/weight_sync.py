"""A split-pool weight sync before and after bucketing: per-process RSS peak and seconds
of the sender (the actor's rank 0 exporting) and of a receiver (a rollout rank loading
into its engine).

- flat (before, issue 30): the policy's whole state dict (`policy_weights`), packed into
  one uint8 buffer (`pack_weights`, kept here as the baseline: the engine no longer has
  it); the receiver takes the whole buffer, then loads bucket views of it.
- bucketed (now, `hybridflow/workers/rollout/weights.py`): the sender gathers one bucket
  at a time and puts it (then drops it); the receiver gets, loads and drops one at a time.

By default both go through the same transport, a folder of files standing in for the
Ray object store (one file per put; a get reads the file into the process), so only
what each process holds privately is compared. `--ray` runs each side in a Ray actor
and sends through Ray's object store itself: the store's pages, mapped into both
processes, then count in their RSS too ("of it shared": RssShmem's rise), once for the
whole export in both variants (the flat buffer with the tied embedding twice). With
`--ray` each pair of actors syncs twice, "first" (fresh processes: what a run's first
sync pays, imports and first-touched pages included) and "again" (the same processes:
every later sync), and the sync's seconds (sender + receiver, the plan runs the two
stages one after the other) are given as a ratio to the flat baseline of the same run.
Every (variant, side) runs in a fresh process (the RSS high-water mark is per process,
reset with /proc/self/clear_refs right before the sync), one torch thread, variants
alternated over the repetitions. The model is a toy Llama built from a config (no
download), tied embeddings (the flat pack wrote them twice).

    python bench/weight_sync.py                 # -> bench/results/weight_sync.json
    python bench/weight_sync.py --ray           # -> bench/results/weight_sync_ray.json
    python bench/weight_sync.py --layers 4 --reps 1 --out ws.json
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import machine, median, set_threads, table, write_results

MIB = 2**20
VARIANTS = ("flat", "bucketed")
PHASES = ("first", "again")  # --ray: a fresh pair's first sync, then the next one


def _model(args, seed: int):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "llama", hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=8,
        vocab_size=args.vocab, tie_word_embeddings=True))


# ------------------------------------------------------------ the old baseline
def _flat_pack(module, bucket_bytes: int):
    """The removed path: every weight (tied twice) in one flat buffer + its index."""
    import torch
    weights = {k: v.detach() for k, v in module.state_dict().items()}
    names, offsets, buckets, offset, first, start = [], [], [], 0, 0, 0
    for i, (name, t) in enumerate(weights.items()):
        nbytes = t.numel() * t.element_size()
        if i > first and offset + nbytes - start > bucket_bytes:
            buckets.append((first, i))
            first, start = i, offset
        names.append(name)
        offsets.append(offset)
        offset += -(-nbytes // 16) * 16
    buckets.append((first, len(names)))
    flat = torch.zeros(offset, dtype=torch.uint8)
    for t, at in zip(weights.values(), offsets):
        data = t.contiguous().reshape(-1).view(torch.uint8)
        flat[at:at + data.numel()] = data
    meta = [(n, weights[n].dtype, tuple(weights[n].shape), o) for n, o in zip(names, offsets)]
    return flat, meta, buckets


def _flat_buckets(flat, meta, buckets):
    import torch
    for first, end in buckets:
        out = []
        for name, dtype, shape, at in meta[first:end]:
            count = 1
            for d in shape:
                count *= d
            size = count * torch.empty((), dtype=dtype).element_size()
            out.append((name, flat[at:at + size].view(dtype).view(shape)))
        yield out


# ------------------------------------------------------------------ the sides
class FolderStore:
    """One file per put; `get` reads it back into the process."""

    def __init__(self, folder: str):
        self.folder, self.count = folder, 0

    def put(self, stored):
        self.count += 1
        path = os.path.join(self.folder, f"bucket{self.count}")
        with open(path, "wb") as fh:
            for _, raw, _, _ in stored:
                fh.write(memoryview(raw))
        return path, [(n, raw.nbytes, dt, sh) for n, raw, dt, sh in stored]

    def get(self, ref):
        import numpy as np
        path, entries = ref
        with open(path, "rb") as fh:
            return [(n, np.fromfile(fh, dtype=np.uint8, count=nb), dt, sh)
                    for n, nb, dt, sh in entries]


def _send(model, args, variant: str, folder: str) -> None:
    from hybridflow.workers.rollout.weights import export_policy
    bucket = int(args.bucket_mb * MIB)
    if variant == "flat":
        flat, meta, buckets = _flat_pack(model, bucket)
        flat.numpy().tofile(os.path.join(folder, "flat"))
        record = (meta, buckets)
    else:
        export = export_policy(model, 1, bucket, store=FolderStore(folder))
        record = export["weights"][0].refs
    with open(os.path.join(folder, "export.pkl"), "wb") as fh:
        pickle.dump(record, fh)


def _receive(engine, variant: str, folder: str) -> None:
    import numpy as np
    import torch
    from hybridflow.workers.rollout.weights import StoredBuckets
    with open(os.path.join(folder, "export.pkl"), "rb") as fh:
        record = pickle.load(fh)
    if variant == "flat":
        meta, buckets = record
        flat = torch.from_numpy(np.fromfile(os.path.join(folder, "flat"), dtype=np.uint8))
        source = _flat_buckets(flat, meta, buckets)
    else:
        source = StoredBuckets(record, FolderStore(folder))
    engine.wake_up()
    for bucket in source:
        engine.load_weights(bucket)
        del bucket
    engine.finish_weight_update(1)


def _reset_peak() -> int:
    """VmHWM := VmRSS now; returns that RSS."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return _status("VmRSS")


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(field + ":"))


def _child(args) -> None:
    """One side of one sync in this process; prints its JSON result."""
    set_threads(1)
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    from hybridflow.workers.rollout.hf import HFEngine
    model = _model(args, seed=0 if args.side == "sender" else 1)
    state = sum(p.numel() * p.element_size() for p in model.parameters())
    engine = HFEngine(model, None, torch.device("cpu"), shares_module=False)
    base = _reset_peak()
    start = time.perf_counter()
    if args.side == "sender":
        _send(model, args, args.variant, args.folder)
    else:
        _receive(engine, args.variant, args.folder)
    seconds = time.perf_counter() - start
    peak = _status("VmHWM") - base
    if args.side == "receiver":  # it holds the sender's weights now
        reference = _model(args, seed=0).state_dict()
        assert all(model.state_dict()[k].equal(v) for k, v in reference.items())
    print(json.dumps({"peak_bytes": peak, "seconds": seconds, "state_bytes": state}))


def _run_side(args, variant: str, side: str, folder: str) -> dict:
    cmd = [sys.executable, __file__, "--child", "--variant", variant, "--side", side,
           "--folder", folder, "--hidden", str(args.hidden), "--layers", str(args.layers),
           "--vocab", str(args.vocab), "--bucket-mb", str(args.bucket_mb)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------- on Ray itself
class RaySide:
    """One side in a Ray actor of its own (made remote in `_ray_runs`): the export goes
    through Ray's object store as the plan's weight-sync edge sends it."""

    def __init__(self, args, seed: int):
        set_threads(1)
        import warnings
        warnings.filterwarnings("ignore")
        import torch
        from hybridflow.workers.rollout.hf import HFEngine
        self.model = _model(args, seed)
        self.engine = HFEngine(self.model, None, torch.device("cpu"), shares_module=False)
        self.bucket = int(args.bucket_mb * MIB)

    def _measure(self, work):
        base, shared = _reset_peak(), _status("RssShmem")
        start = time.perf_counter()
        out = work()
        return out, {"peak_bytes": _status("VmHWM") - base, "seconds":
                     time.perf_counter() - start, "shared_bytes": _status("RssShmem") - shared}

    def send(self, variant: str):
        import ray
        from hybridflow.workers.rollout.weights import export_policy

        def work():
            if variant == "flat":
                flat, meta, buckets = _flat_pack(self.model, self.bucket)
                return [ray.put(flat.numpy()), meta, buckets]
            return export_policy(self.model, 1, self.bucket)
        return self._measure(work)

    def receive(self, variant: str, export) -> dict:
        import ray
        import torch

        def work():
            if variant == "flat":
                ref, meta, buckets = export
                flat = torch.from_numpy(ray.get(ref))
                for bucket in _flat_buckets(flat, meta, buckets):
                    self.engine.load_weights(bucket)
                self.engine.finish_weight_update(1)
            else:
                from hybridflow.workers.rollout.weights import load_export
                load_export(self.engine, export)
        return self._measure(work)[1]

    def checksum(self) -> float:
        return float(sum(p.double().sum() for p in self.model.parameters()))


def _ray_runs(args, runs: dict) -> None:
    """Per repetition and variant, one fresh pair of actors syncs twice: "first" (a
    fresh process: what a run's first sync pays, imports and first-touched pages
    included) and "again" (the same processes: every later sync of a run)."""
    import ray
    from hybridflow.runtime.ray.session import workers_at_driver_priority
    with workers_at_driver_priority():  # as a run's own Ray: workers at nice 0
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    side = ray.remote(num_cpus=0)(RaySide)
    state = sum(p.numel() * p.element_size() for p in _model(args, 0).parameters())
    try:
        for rep in range(args.reps):
            for variant in VARIANTS[rep % 2:] + VARIANTS[:rep % 2]:
                sender, receiver = side.remote(args, 0), side.remote(args, 1)
                ray.get([sender.checksum.remote(), receiver.checksum.remote()])  # built
                for phase in PHASES:
                    export, sent = ray.get(sender.send.options(num_returns=2).remote(variant))
                    got = ray.get(receiver.receive.remote(variant, export))
                    assert ray.get(receiver.checksum.remote()) == ray.get(
                        sender.checksum.remote())
                    del export
                    for name, record in (("sender", sent), ("receiver", got)):
                        runs[variant][name].append({**record, "state_bytes": state,
                                                    "phase": phase, "rep": rep})
                for actor in (sender, receiver):
                    ray.kill(actor)
    finally:
        ray.shutdown()


def _summary(runs: dict, state: int) -> tuple[dict, list, list]:
    """Per (variant, side, phase): the RSS peak (max), its shared part and the median
    seconds; per (variant, phase): the sync's seconds (sender + receiver of each run,
    median) and its ratio to the flat baseline's in the same run."""
    summary, rows, syncs = {}, [], []
    for variant in VARIANTS:
        for phase in PHASES:
            for side in ("sender", "receiver"):
                recs = [r for r in runs[variant][side] if r.get("phase", "first") == phase]
                if not recs:
                    continue
                peak = max(r["peak_bytes"] for r in recs)
                shared = max(r.get("shared_bytes", 0) for r in recs)
                secs = median([r["seconds"] for r in recs])
                summary[f"{variant}/{side}/{phase}"] = {
                    "peak_mib": peak / MIB, "peak_x_state": peak / state,
                    "shared_mib": shared / MIB, "seconds": secs}
                rows.append([variant, side, phase, peak / MIB, peak / state, shared / MIB,
                             secs])
    for phase in PHASES:
        totals = {v: median([s["seconds"] + r["seconds"] for s, r in zip(
            runs[v]["sender"], runs[v]["receiver"]) if s.get("phase", "first") == phase])
            for v in VARIANTS if any(s.get("phase", "first") == phase
                                     for s in runs[v]["sender"])}
        for variant, total in totals.items():
            ratio = total / totals["flat"]
            summary[f"{variant}/sync/{phase}"] = {"seconds": total, "x_flat": ratio}
            syncs.append([variant, phase, total, ratio])
    return summary, rows, syncs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--bucket-mb", type=float, default=16.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--ray", action="store_true",
                        help="each side in a Ray actor, the export through Ray's object store")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=("sender", "receiver"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)
    runs = {v: {"sender": [], "receiver": []} for v in VARIANTS}
    info = machine()
    if args.ray:
        _ray_runs(args, runs)
    for rep in range(0 if args.ray else args.reps):  # alternated: who goes first rotates
        order = VARIANTS[rep % 2:] + VARIANTS[:rep % 2]
        for variant in order:
            with tempfile.TemporaryDirectory() as folder:
                for side in ("sender", "receiver"):
                    runs[variant][side].append(_run_side(args, variant, side, folder))
    state = runs["flat"]["sender"][0]["state_bytes"]
    summary, rows, syncs = _summary(runs, state)
    print(f"model state {state / MIB:.1f} MiB (tied embedding once), bucket "
          f"{args.bucket_mb} MiB, {args.reps} alternated runs, 1 torch thread, "
          f"{'Ray object store' if args.ray else 'a folder of files'} between the sides, "
          f"load {info['load_avg_1m_at_start']} at the start")
    print(table(["variant", "side", "sync", "RSS peak MiB", "x state", "of it shared MiB",
                 "seconds (median)"], rows))
    print(table(["variant", "sync", "sender + receiver s (median)", "x flat"], syncs))
    path = write_results("weight_sync_ray" if args.ray else "weight_sync", {
        "machine": info, "config": vars(args), "state_bytes": state,
        "summary": summary, "runs": runs}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
