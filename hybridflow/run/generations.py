"""Sample generations: what the model wrote, next to its score, where a user sees it.

A reward that stays 0 says nothing about why; the responses do. Each sample is a
record {step, split, prompt, response, score, ground_truth, data_source}:

- appended to `generations.jsonl` in the run directory (one JSON object a line);
- printed, for validation (`trainer.log_val_generations`, on by default with a few);
- sent to TensorBoard (a text panel `generations/<split>`) and W&B (a table
  `generations/<split>`) when those sinks are on.

Training samples (`trainer.log_generations`, off by default) are written every step
but not printed (the progress bar stays readable). Responses are decoded with their
special tokens, so a response that never stopped (no end-of-turn token) shows it;
padding after the end is not part of the response mask and is not shown.
"""
from __future__ import annotations

import json

from hybridflow.core.printable import printable

__all__ = ["GenerationLog", "pick_rows", "format_samples", "train_nodes", "GENERATIONS_FILE"]

GENERATIONS_FILE = "generations.jsonl"
_PRINT_CHARS = 300  # a printed prompt or response is cut to this many characters


def pick_rows(total: int, n: int) -> list[int]:
    """`n` row indices spread over `total` rows (a batch holds each prompt's group of
    responses side by side: the first n would all be one prompt's)."""
    if n <= 0 or total <= 0:
        return []
    if n >= total:
        return list(range(total))
    return sorted({int(i * total / n) for i in range(n)})


def _decode(tokenizer, ids, mask) -> str:
    return tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=False)


def _clip(text: str) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= _PRINT_CHARS else text[:_PRINT_CHARS] + "..."


def format_samples(samples: list[dict]) -> str:
    """The lines printed at validation."""
    lines = []
    for s in samples:
        lines.append(f"[{s['split']} step {s['step']}] score={s['score']:.3g} "
                     f"truth={s['ground_truth']!r}")
        lines.append(f"  prompt:   {_clip(s['prompt'])}")
        lines.append(f"  response: {_clip(s['response'])}")
    return printable("\n".join(lines))  # a model's output must not drive the terminal


class GenerationLog:
    """Collects samples from a step's outputs and writes them to the run's sinks."""

    def __init__(self, path: str, tokenizer, sinks=None, echo=None):
        self.path, self.tokenizer, self.sinks = path, tokenizer, sinks
        self.echo = echo or _tqdm_write

    def samples(self, runtime, result, rollout: str, score: str, n: int, step: int,
                split: str) -> list[dict]:
        """Up to `n` records of the rollout node `rollout` scored by node `score`."""
        if n <= 0 or rollout not in result.outputs or score not in result.outputs:
            return []
        rows = runtime.fetch(result, rollout, ("raw_prompt", "responses", "response_mask",
                                               "ground_truth", "data_source"))
        scores = runtime.fetch(result, score, ("scores",))["scores"]
        out = []
        for i in pick_rows(len(rows["raw_prompt"]), n):
            value = scores[i]
            value = float(value.sum()) if getattr(value, "ndim", 0) else float(value)
            out.append({"step": step, "split": split, "prompt": str(rows["raw_prompt"][i]),
                        "response": _decode(self.tokenizer, rows["responses"][i],
                                            rows["response_mask"][i]),
                        "score": value, "ground_truth": _plain(rows["ground_truth"][i]),
                        "data_source": str(rows["data_source"][i])})
        return out

    def write(self, samples: list[dict], show: bool = False) -> None:
        if not samples:
            return
        with open(self.path, "a", encoding="utf-8") as fh:
            for s in samples:
                fh.write(json.dumps(s) + "\n")
        if show:
            self.echo(format_samples(samples))
        if self.sinks is not None:
            _to_sinks(self.sinks, samples)


def _plain(value):
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


def _tqdm_write(text: str) -> None:
    from tqdm import tqdm
    tqdm.write(text)  # above a progress bar if one is drawn, a plain print otherwise


_COLUMNS = ("step", "split", "prompt", "response", "score", "ground_truth")


def _to_sinks(sinks, samples: list[dict]) -> None:
    """TensorBoard text (a markdown table) and a W&B table, when those are on."""
    split, step = samples[0]["split"], samples[0]["step"]
    tb, wb = getattr(sinks, "tb", None), getattr(sinks, "wb", None)
    if tb is not None:
        head = "| " + " | ".join(_COLUMNS) + " |\n|" + "---|" * len(_COLUMNS) + "\n"
        body = "".join("| " + " | ".join(_cell(s[c]) for c in _COLUMNS) + " |\n"
                       for s in samples)
        tb.add_text(f"generations/{split}", head + body, step)
    if wb is not None:
        import wandb
        table = wandb.Table(columns=list(_COLUMNS),
                            data=[[s[c] for c in _COLUMNS] for s in samples])
        wb.log({f"generations/{split}": table}, step=step)


def _cell(value) -> str:
    """A markdown table cell: pipes escaped, newlines shown as \\n."""
    return printable(str(value).replace("|", "\\|").replace("\n", "\\n"))


def train_nodes(plan) -> tuple[str, str] | None:
    """(generate node, the node scoring its rows) of a training plan, or None when
    the plan has no such pair (an SFT graph): what `trainer.log_generations` samples."""
    from hybridflow.core.kinds import NodeKind
    from hybridflow.plan.async_split import BUFFER_PREFIX
    for gen in plan.nodes:
        if gen.kind is not NodeKind.GENERATE:
            continue
        held = BUFFER_PREFIX + gen.name  # an async plan's scorer may read its buffer
        for node in plan.nodes:
            if "scores" in node.writes and (gen.name in node.deps or held in node.deps):
                return (gen.name if gen.name in node.deps else held), node.name
    return None
