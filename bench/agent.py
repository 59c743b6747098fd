"""Agent rollouts: the concurrent episode runner against lockstep turn-by-turn batching.

Both variants are the same `EpisodeRunner` on the same rows and play the same
episodes (checked: identical token ids, masks and rewards); only the schedule
differs:
  - continuous: generate for whichever episodes are ready (batched), while the
    others wait on their environment; a finished episode's slot takes the next row;
  - lockstep: generate for all active episodes, then step all their environments
    and wait for the slowest, turn after turn; the next group of rows starts when
    the whole group has ended.
The environment sleeps 0-50 ms per step (seeded per row and step, so both variants
see the same latencies) and ends an episode after 1-4 model turns; the generator
costs a fixed `--gen-ms` per call whatever its batch (a GPU decoding a small batch),
and its turns depend only on the context (so any schedule gets the same ones).
Variants alternate repetition by repetition; the figure is episodes per second.

    python bench/agent.py [--episodes 128] [--max-active 32] [--reps 5] [--gen-ms 10]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.harness import alternate, machine, median, table, write_results
from hybridflow.agents import (EpisodeRunner, GeneratedTurn, PlainFormat, RunnerOptions,
                               StepResult)
from hybridflow.workers.tokenizer import build_char_tokenizer

TARGET_SPEEDUP = 1.5


class LatencyEnv:
    """Sleeps the row's latency for each step; done after the row's number of turns."""

    def reset(self, row):
        self.row, self.steps = row, 0
        return row["prompt"]

    def step(self, turn):
        time.sleep(self.row["latency_s"][self.steps])
        self.steps += 1
        if self.steps >= self.row["turns"]:
            return StepResult(reward=1.0, done=True)
        return StepResult(observation=f" r{self.steps} ", tool_calls=1)


class FixedCostGenerator:
    """`cost_s` per call, whatever the batch; turns seeded by the context."""

    def __init__(self, token_ids, stop_id, cost_s):
        self.token_ids, self.stop_id, self.cost_s = token_ids, stop_id, cost_s

    def __call__(self, contexts, max_new_tokens):
        time.sleep(self.cost_s)
        turns = []
        for context in contexts:
            rng = random.Random(hashlib.sha1(str(context).encode()).hexdigest())
            ids = [rng.choice(self.token_ids) for _ in range(rng.randint(2, 8))]
            turns.append(GeneratedTurn((ids + [self.stop_id])[:max_new_tokens],
                                       None))
        return turns


def make_rows(n: int, seed: int, max_latency_ms: float, max_turns: int = 4) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": f"{rng.randint(0, 99999)}+{rng.randint(0, 99999)}=",
             "turns": rng.randint(1, max_turns),
             "latency_s": [rng.uniform(0, max_latency_ms) / 1000 for _ in range(max_turns)]}
            for _ in range(n)]


def _fingerprint(result) -> str:
    parts = [(e.status, e.reward, e.trajectory.response_ids, e.trajectory.loss_mask)
             for e in result.episodes]
    return hashlib.sha1(repr(parts).encode()).hexdigest()


def run(episodes: int = 128, max_active: int = 32, reps: int = 5, gen_ms: float = 10.0,
        max_latency_ms: float = 50.0, seed: int = 0, out: str | None = None,
        quiet: bool = False) -> dict:
    tok = build_char_tokenizer()
    fmt = PlainFormat(tok)
    generator = FixedCostGenerator(tok.convert_tokens_to_ids(list("abcdefgh")),
                                   tok.eos_token_id, gen_ms / 1000)
    rows = make_rows(episodes, seed, max_latency_ms)
    results: dict[str, list] = {"continuous": [], "lockstep": []}

    def variant(lockstep: bool):
        options = RunnerOptions(max_turns=4, max_response_tokens=128, max_turn_tokens=16,
                                max_active=max_active, lockstep=lockstep,
                                env_threads=max(8, max_active or episodes))
        runner = EpisodeRunner(LatencyEnv, generator, fmt, options, "latency")
        name = "lockstep" if lockstep else "continuous"
        return lambda: results[name].append(runner.run(rows))

    times = alternate({"continuous": variant(False), "lockstep": variant(True)}, reps)
    fingerprints = {name: {_fingerprint(r) for r in rs} for name, rs in results.items()}
    same = len(fingerprints["continuous"] | fingerprints["lockstep"]) == 1
    rows_out = []
    for name in ("continuous", "lockstep"):
        metrics = results[name][-1].metrics
        rows_out.append({"variant": name, "median_s": median(times[name]),
                         "episodes_per_s": episodes / median(times[name]),
                         "generate_calls": metrics["agent/generate_calls_total"],
                         "rows_per_call": metrics["agent/generate_rows/mean"],
                         "turns_mean": metrics["agent/turns/mean"]})
    speedup = rows_out[0]["episodes_per_s"] / rows_out[1]["episodes_per_s"]
    payload = {
        "machine": machine(),
        "setup": {"episodes": episodes, "max_active": max_active, "reps": reps,
                  "gen_ms_per_call": gen_ms, "env_latency_ms": [0, max_latency_ms],
                  "turns": [1, 4], "seed": seed},
        "rows": rows_out, "times_s": times, "same_episodes": same,
        "targets": {"speedup": speedup, "target": TARGET_SPEEDUP,
                    "verdict": "met" if speedup >= TARGET_SPEEDUP and same else "missed"},
    }
    write_results("agent", payload, out)
    if not quiet:
        print(report(payload))
    return payload


def report(payload: dict) -> str:
    headers = ["variant", "median s", "episodes/s", "generate calls", "rows/call", "turns"]
    body = [[r["variant"], r["median_s"], r["episodes_per_s"], r["generate_calls"],
             r["rows_per_call"], r["turns_mean"]] for r in payload["rows"]]
    t = payload["targets"]
    return (f"machine: {payload['machine']['cpu']}, {payload['machine']['cores']} cores, "
            f"load {payload['machine']['load_avg_1m_at_start']}\nsetup: {payload['setup']}\n"
            f"{table(headers, body)}\nsame episodes in both: {payload['same_episodes']}\n"
            f"continuous / lockstep episodes per second: {t['speedup']:.2f}x "
            f"(target >= {t['target']}x): {t['verdict']}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--max-active", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--gen-ms", type=float, default=10.0)
    parser.add_argument("--max-latency-ms", type=float, default=50.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    run(args.episodes, args.max_active, args.reps, args.gen_ms, args.max_latency_ms,
        args.seed, args.out)


if __name__ == "__main__":
    main()
