"""Sequence parallelism at sp=1 vs sp=N on one long row (issue 38, "Measure"): per-rank
peak RSS and seconds of `actor.update`, and `hybridflow check --memory`'s prediction of
the same pass beside it.

The model: SmolLM2-135M's shapes (hidden 576, 30 layers, 9 heads, 3 KV heads,
intermediate 1536, vocabulary 49,152, tied; read from the real config.json when it is
here, bench/parallel_workers.default_model), random weights, float32. Its 9 heads and 3
KV heads allow sp = 1 or 3 (each rank attends with whole heads,
`sequence_parallel.check_model`): the default sharded variant is sp=3 on three gloo
ranks; `--heads 8 --kv-heads 2` (head_dim 72, every other shape SmolLM2's) allows sp=2.

The batch: one row of 64 prompt + R response tokens (R = 2K, 4K, 8K). sp=1 is one rank
(`WorkerContext(world_size=1)`): the row is all of the step; sp=N is N ranks of one row
group (dp 1 x sp N, `WorkerContext(world_size=N, sp=N)`), which all receive the row and
split its positions. Both train with `actor.strategy=fsdp2` (over the N ranks at sp=N:
the wrap spans dp x sp) and chunked log-probs (`actor.logprob_chunk`, default), with and
without `model.gradient_checkpointing`. Each rank builds an `ActorWorker`, runs one
update on a short row (AdamW allocates its moments at the first step), then the measured
update of the long row: its seconds (the slowest rank) and its RSS high-water mark
(VmHWM, reset right before it; `bench/parallel_workers.RssMeter`). "peak" below is that
mark less the rank's RSS after its imports, before the worker existed (the interpreter,
torch and transformers: what the memory model does not size); "activations" is what
the update added above the RSS before it, less the gradients (trainable bytes over the
FSDP shards): the saved activations and the logits chunk, what sp divides.

Every (R, sp, checkpointing) runs in fresh processes. Before one starts, check
--memory's per-rank prediction times the ranks (x1.3) must fit in MemAvailable; a
variant that does not is recorded as predicted only, and a watchdog stops a variant's
ranks (by pid) if MemAvailable falls under 1.5 GiB. Seconds: the variants of one R run
back to back, who goes first rotating with R; read them as sp=N/sp=1 ratios, with the
load printed (on 2 cores, 3 ranks are oversubscribed: their seconds are not comparable).

    python bench/sequence_parallel.py                       # -> results/sequence_parallel.json
    python bench/sequence_parallel.py --lengths 2048 --checkpointing off
    python bench/sequence_parallel.py --heads 8 --kv-heads 2 --sp 2 --out sp2.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import free_port, leave_group, machine, rss_bytes, table, write_results

MIB, GIB = 2 ** 20, 2 ** 30
PROMPT = 64
WARM_RESPONSE = 64  # the warm-up update's row (allocates AdamW's moments)
TARGET = 0.6  # issue 38: activations per rank at sp=N <= 0.6x sp=1's at 4K and 8K
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "vocab_size")
FLOOR_BYTES = int(1.5 * GIB)  # the watchdog stops a variant below this MemAvailable


def hf_config(args) -> dict:
    """SmolLM2-135M's shapes (its config.json when here), heads from the flags."""
    from bench.chunked_logprobs import SMOLLM2
    from bench.parallel_workers import default_model
    config = dict(SMOLLM2)
    path = default_model()
    if path:
        with open(os.path.join(path, "config.json")) as fh:
            real = json.load(fh)
        config.update({k: real[k] for k in SHAPE_KEYS})
    if args.layers:
        config["num_hidden_layers"] = args.layers
    if args.heads:
        config.update(num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      head_dim=config["hidden_size"] // args.heads)
    config["max_position_embeddings"] = 16384  # rope's table; no memory in the pass
    return config


def worker_cfg(config: dict, response: int, checkpointing: bool,
               packed: bool = False) -> dict:
    return {"model": {"hf_config": config, "device": "cpu",
                      "gradient_checkpointing": checkpointing,
                      "use_remove_padding": packed},
            "actor": {"micro_batch_size": 1, "mini_batch_size": 1, "lr": 1e-6,
                      "strategy": "fsdp2"},
            "rollout": {"max_new_tokens": response, "log_prob_micro_batch_size": 1, "n": 1},
            "data": {"max_prompt_length": PROMPT, "batch_size": 1}}


def predicted(config: dict, response: int, sp: int, checkpointing: bool,
              packed: bool = False) -> dict:
    """`hybridflow check --memory`'s actor figures for this variant (bytes per rank):
    the resident state and each part of `actor.update`."""
    from hybridflow.memory.report import plan_memory
    from hybridflow.program.assemble import prepare
    overrides = ["model.path=null", "data.batch_size=1", "rollout.n=1",
                 f"rollout.max_new_tokens={response}", f"data.max_prompt_length={PROMPT}",
                 "actor.mini_batch_size=1", "actor.micro_batch_size=1",
                 "actor.strategy=fsdp2", f"model.gradient_checkpointing={checkpointing}",
                 f"model.use_remove_padding={packed}",
                 "runtime.name=ray", f"placement.pools.main.devices_per_node={sp}",
                 f"placement.parallel.actor.sp={sp}", f"placement.parallel.ref.sp={sp}"]
    overrides += [f"model.hf_config.{k}={v}" for k, v in config.items()]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    loaded = prepare(os.path.join(root, "graphs", "grpo.py"), overrides, preflight=False)
    actor = next(r for r in plan_memory(loaded.cfg, loaded.plan).roles if r.role == "actor")
    update = dict(actor.passes["actor.update"])
    return {"resident": dict(actor.resident), "update": update,
            "peak_bytes": sum(actor.resident.values()) + sum(update.values())}


def sharded_bytes(pred: dict, sp: int) -> int:
    """The predicted peak with the resident state and gradients over dp x sp FSDP
    shards, as the workers hold them (check --memory shards over dp only)."""
    return pred["peak_bytes"] - (sp - 1) * (sum(pred["resident"].values())
                                            + pred["update"].get("gradients", 0)) // sp


def rank_main(rank: int, world: int, port: int, spec: dict, out_dir: str) -> None:
    """One rank of a variant (torch.multiprocessing): warm-up update, measured update."""
    import gc
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from bench.chunked_logprobs import long_row
    from bench.harness import quiet_logs
    from bench.parallel_workers import RssMeter, _measured
    from hybridflow.workers import ActorWorker, WorkerContext
    quiet_logs()
    base = rss_bytes()
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu",
                        sp=spec["sp"])
    actor = ActorWorker(worker_cfg(spec["config"], spec["response"],
                                   spec["checkpointing"], spec.get("packed", False)), ctx)
    actor.update(long_row(WARM_RESPONSE))
    batch = padded_row(spec["response"], spec.get("pad", 0))
    gc.collect()

    def barrier():
        if torch.distributed.is_initialized():
            torch.distributed.barrier()

    record = {"rank": rank, "base_rss_bytes": base, "rss_before_bytes": rss_bytes(),
              "gradient_bytes": sum((p.to_local() if hasattr(p, "to_local") else p).nbytes
                                    for p in actor.module.parameters())}
    _measured(record, "actor.update", lambda: actor.update(batch), barrier, RssMeter())
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(record, fh)
    if world > 1:
        leave_group(rank, world, out_dir)


def padded_row(response: int, pad: int):
    """`bench/chunked_logprobs.long_row` with its first `pad` prompt columns left
    padding (mask 0, positions counted from the first real token), as the data loader
    leaves a prompt shorter than `data.max_prompt_length`: the attention then reads a
    mask (without padding sdpa runs causal, maskless)."""
    from bench.chunked_logprobs import long_row
    batch = long_row(response)
    if pad:
        mask = batch["attention_mask"].clone()
        mask[:, :pad] = 0
        ids = batch["input_ids"].clone()
        ids[:, :pad] = 0
        batch["attention_mask"], batch["input_ids"] = mask, ids
        batch["position_ids"] = (mask.cumsum(1) - 1).clamp(min=0)
    return batch


def mem_available() -> int:
    with open("/proc/meminfo") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh
                    if line.startswith("MemAvailable:"))


def run_variant(spec: dict) -> tuple[list[dict] | None, str | None]:
    """The ranks' records, or None and why the variant was not (fully) run."""
    import torch.multiprocessing as mp
    world = spec["sp"]
    need = int(1.3 * world * sharded_bytes(spec["predicted"], world)) + world * GIB
    if need > mem_available():
        return None, (f"not run: {need / GIB:.1f} GiB predicted for {world} rank(s), "
                      f"{mem_available() / GIB:.1f} GiB available")
    with tempfile.TemporaryDirectory() as out_dir:
        procs = mp.start_processes(rank_main, args=(world, free_port(), spec, out_dir),
                                   nprocs=world, join=False, start_method="spawn")
        while not procs.join(timeout=0.5):
            if mem_available() < FLOOR_BYTES:
                for p in procs.processes:  # only the ranks this call started
                    if p.is_alive():
                        p.kill()
                return None, f"stopped: MemAvailable under {FLOOR_BYTES / GIB:.1f} GiB"
        ranks = []
        for r in range(world):
            with open(os.path.join(out_dir, f"rank{r}.json")) as fh:
                ranks.append(json.load(fh))
    return ranks, None


def summarize(spec: dict, ranks: list[dict] | None, why: str | None) -> dict:
    """One variant's record. Predictions are per rank and include the process
    (`memory.engines.PROCESS_BYTES`, what check --memory adds for a CPU rank), so they
    compare with the whole VmHWM; "sharded" is the same figure with the resident state
    and gradients over dp x sp FSDP shards (what the workers do) instead of dp."""
    from hybridflow.memory.engines import PROCESS_BYTES
    pred, sp = spec["predicted"], spec["sp"]
    out = {k: spec[k] for k in ("response", "sp", "checkpointing")}
    out.update(pad=spec.get("pad", 0), packed=spec.get("packed", False),
               layers=spec["config"]["num_hidden_layers"],
               predicted=pred, note=why, ranks=ranks)
    update = pred["update"]
    out["predicted_activation_bytes"] = update.get("activations", 0) + update.get("logits", 0)
    out["predicted_bytes"] = pred["peak_bytes"] + PROCESS_BYTES
    out["predicted_sharded_bytes"] = sharded_bytes(pred, sp) + PROCESS_BYTES
    out["predicted_logits_share"] = update.get("logits", 0) / out["predicted_bytes"]
    if not ranks:
        return out
    phase = [r["actor.update"] for r in ranks]
    out["process_bytes"] = max(r["base_rss_bytes"] for r in ranks)
    return measured(out, max(p["peak_rss_bytes"] for p in phase),
                    max(p["rise_bytes"] - r["gradient_bytes"] for p, r in zip(phase, ranks)),
                    max(p["seconds"] for p in phase))


def measured(out: dict, peak: int, activations: int, seconds: float) -> dict:
    """`out` with a variant's measured figures and the predictions' errors."""
    out.update(seconds=seconds, peak_rss_bytes=peak, activation_bytes=activations,
               prediction_error=out["predicted_bytes"] / peak - 1,
               sharded_prediction_error=out["predicted_sharded_bytes"] / peak - 1,
               logits_share=out["predicted"]["update"].get("logits", 0) / peak)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--sp", type=int, nargs="+", default=[1, 3],
                        help="the sizes to run (sp=1 is the baseline of the ratios)")
    parser.add_argument("--checkpointing", choices=("off", "on", "both"), default="both")
    parser.add_argument("--layers", type=int, default=0, help="fewer layers (0: all)")
    parser.add_argument("--heads", type=int, default=0, help="attention heads (0: SmolLM2's)")
    parser.add_argument("--kv-heads", type=int, default=0)
    parser.add_argument("--pad", type=int, default=0,
                        help="left-padding columns in the prompt (0: none, sdpa maskless)")
    parser.add_argument("--packed", action="store_true",
                        help="model.use_remove_padding=true (sdpa_varlen: no mask)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--longest", type=float, metavar="GIB", default=None,
                        help="only the longest response per rank of GIB, predicted at "
                             "each --sp, with and without checkpointing (nothing is run)")
    parser.add_argument("--report", metavar="JSON", nargs="+", default=None,
                        help="re-tabulate results files' ranks as one (nothing is run)")
    args = parser.parse_args()
    if args.report:
        return rereport(args)
    if args.heads and not args.kv_heads:
        parser.error("--heads needs --kv-heads")
    config = hf_config(args)
    for key in ("num_attention_heads", "num_key_value_heads"):
        for sp in args.sp:
            if config[key] % sp:
                parser.error(f"--sp {sp} does not divide the model's {key}={config[key]}")
    if args.longest:
        return print_longest(config, args.sp, args.longest * GIB, args.packed)
    info = machine()
    ckpts = {"off": (False,), "on": (True,), "both": (False, True)}[args.checkpointing]
    records = []
    for i, response in enumerate(args.lengths):
        for checkpointing in ckpts:
            order = args.sp if i % 2 == 0 else args.sp[::-1]  # who goes first rotates
            for sp in order:
                spec = {"config": config, "response": response, "sp": sp,
                        "checkpointing": checkpointing, "pad": args.pad,
                        "packed": args.packed}
                spec["predicted"] = predicted(config, response, sp, checkpointing,
                                              args.packed)
                load = os.getloadavg()[0]
                ranks, why = run_variant(spec)
                record = summarize(spec, ranks, why)
                record["load_1m"] = load
                records.append(record)
                print(json.dumps({k: v for k, v in record.items() if k != "ranks"}),
                      flush=True)
    report(args, config, info, records)


def longest(config: dict, sp: int, checkpointing: bool, capacity: float,
            step: int = 256, packed: bool = False) -> int:
    """The longest response (a multiple of `step`) of one row whose predicted peak per
    rank, `sharded_bytes` (no process: a device's figure), fits `capacity` bytes."""
    def fits(response: int) -> bool:
        return sharded_bytes(predicted(config, response, sp, checkpointing, packed),
                             sp) <= capacity
    lo, hi = 0, step
    while fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def print_longest(config: dict, sizes: list[int], capacity: float,
                  packed: bool = False) -> None:
    rows = [[sp, "on" if ckpt else "off", longest(config, sp, ckpt, capacity, packed=packed)]
            for sp in sizes for ckpt in (False, True)]
    print(f"the longest response of one {PROMPT}-token-prompt row per {capacity / GIB:g} GiB "
          "rank (check --memory, resident state over dp x sp FSDP shards, chunked log-probs"
          f"{', packed' if packed else ''})")
    print(table(["sp", "ckpt", "response tokens"], rows))


def rereport(args) -> None:
    """One table and results file from the records of several (runs that could not
    share one invocation: different --pad or --layers are kept apart by the table's
    columns only if given one file each), summarized again."""
    records, config, info = [], None, None
    for path in args.report:
        with open(path) as fh:
            old = json.load(fh)
        config, info = config or old["hf_config"], info or old["machine"]
        pad = old["config"].get("pad", 0)
        for r in old["records"]:
            again = summarize({**r, "config": config, "pad": r.get("pad", pad)},
                              r["ranks"], r["note"])
            if not r["ranks"] and "peak_rss_bytes" in r:  # kept without its ranks
                measured(again, r["peak_rss_bytes"], r["activation_bytes"], r["seconds"])
            records.append({**again, "load_1m": r["load_1m"]})
    args.pad = records[0]["pad"] if records else 0
    report(args, config, info, records)


def _key(record: dict) -> tuple:
    """What a ratio holds fixed: all but sp."""
    return (record["response"], record["checkpointing"], record["pad"], record["layers"],
            record.get("packed", False))


def _baseline(records: list[dict], record: dict) -> dict | None:
    return next((r for r in records if r["sp"] == 1 and _key(r) == _key(record)), None)


def _percent(record: dict, key: str) -> float | None:
    return record[key] * 100 if key in record else None


def report(args, config: dict, info: dict, records: list[dict]) -> None:
    rows, ratios = [], {}
    for r in records:
        one = _baseline(records, r)
        got = "peak_rss_bytes" in r
        act_ratio = (r["activation_bytes"] / one["activation_bytes"]
                     if got and one and "activation_bytes" in one else None)
        secs_ratio = r["seconds"] / one["seconds"] if got and one and "seconds" in one \
            else None
        if r["sp"] != 1:
            ratios["/".join(map(str, (r["sp"], *_key(r))))] = {
                "activations": act_ratio, "seconds": secs_ratio}
        rows.append([r["response"], r["layers"], r["pad"], r["sp"],
                     "on" if r["checkpointing"] else "off",
                     r["peak_rss_bytes"] / GIB if got else None,
                     r["predicted_bytes"] / GIB, _percent(r, "prediction_error"),
                     _percent(r, "sharded_prediction_error"),
                     r["activation_bytes"] / GIB if got else None,
                     r["predicted_activation_bytes"] / GIB, act_ratio,
                     (r["logits_share"] if got else r["predicted_logits_share"]) * 100,
                     r.get("seconds"), secs_ratio, r["load_1m"], r["note"] or ""])
    print(f"SmolLM2-135M shapes (hidden {config['hidden_size']}, "
          f"{config['num_attention_heads']} heads, {config['num_key_value_heads']} KV heads),"
          f" random init, fp32, fsdp2, chunked log-probs, 1 row of {PROMPT} + R tokens "
          f"(pad: left-padding columns of the prompt; "
          f"{'packed' if getattr(args, 'packed', False) else 'not packed'}), gloo, "
          f"1 torch thread per rank; "
          f"{info['cores']} cores, "
          f"load {info['load_avg_1m_at_start']} at start")
    print(table(["R", "layers", "pad", "sp", "ckpt", "peak RSS GiB/rank", "check --memory",
                 "error %", "error % (dp x sp shards)", "activations GiB", "predicted", "x sp1",
                 "logits % of peak", "s", "x sp1 s", "load", "note"], rows))
    path = write_results("sequence_parallel", {
        "machine": info, "config": vars(args), "hf_config": config, "prompt": PROMPT,
        "target_activation_ratio": TARGET, "ratios": ratios, "records": records}, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
