"""Prompt datasets in verl's schema and the loader that feeds source nodes.

A row: `data_source`, `prompt` (a string or chat messages), `ability`,
`reward_model.ground_truth`, `extra_info`. Files are JSONL or parquet. Every row is
checked when the dataset is built, so a malformed row fails the run before any
worker starts, with the file and row number in the message.
"""
from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from hybridflow.core.batch import Batch
from hybridflow.core.kinds import Op
from hybridflow.core.loading import UserFileError, check_file, library_read, read_jsonl
from hybridflow.core.names import import_named

__all__ = ["DataError", "PromptDataset", "PromptLoader", "check_data_file", "read_rows",
           "write_rows", "toy_rows", "word_arith_rows", "unknown_characters", "tokenize_prompts",
           "row_checker"]

RowCheck = Callable[[str, object], None]  # (data_source, ground_truth) -> ValueError/TypeError


class DataError(ValueError):
    """A dataset that cannot be used; names the file and row."""


DATA_EXTENSIONS = (".jsonl", ".parquet")


_DATA_FIX = "give a .jsonl (one JSON object a line) or .parquet file in verl's schema"


def check_data_file(path: str) -> None:
    """A cheap look before reading: a regular, non-empty file of a known format."""
    check_file(path, "data file", _DATA_FIX)
    if not path.endswith(DATA_EXTENSIONS):
        raise UserFileError(f"data file {path!r} has an unknown format: use .jsonl (one JSON "
                            f"object a line) or .parquet", path)


def read_rows(path: str) -> list[dict]:
    """Every row of a data file; any failure names the file (and line)."""
    check_data_file(path)
    if path.endswith(".parquet"):
        with library_read(path, "data file", "it is not a valid parquet file: write it "
                          "again (hybridflow data, or pandas.DataFrame.to_parquet)"):
            import pyarrow.parquet as pq
            return pq.read_table(path).to_pylist()
    return [row for _, row in read_jsonl(path, "data file", dict, _DATA_FIX)]


def write_rows(rows: list[dict], path: str, progress=None) -> None:
    """Write `rows` as JSONL or parquet (by the extension); `progress(n)` is called
    every 10,000 rows written to JSONL, for a progress bar."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if path.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.Table.from_pylist(rows), path)
        return
    with open(path, "w", encoding="utf-8") as fh:
        for number, row in enumerate(rows, 1):
            fh.write(json.dumps(row) + "\n")
            if progress is not None and number % 10_000 == 0:
                progress(10_000)


DEFAULT_TOY_MAKER = "hybridflow.algorithms.rewards.toy:train_test_rows"  # data.toy.maker's default


def toy_rows(seed: int, max_operand: int, test_fraction: float, train_on_test: bool = False,
             maker: str = DEFAULT_TOY_MAKER) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows) of the embedded default task, made by the function
    `maker` names ("package.module:NAME", `data.toy.maker`; the task is not the
    engine's): `maker(seed, max_operand, test_fraction, train_on_test)`."""
    try:
        make = import_named(maker, "data.toy.maker")
    except ValueError as err:
        raise DataError(str(err)) from None
    try:  # the maker refuses sizes it cannot make, naming the largest (issue 32)
        return make(seed, max_operand, test_fraction, train_on_test)
    except ValueError as err:
        raise DataError(f"toy data: {err}") from None


WORD_ARITH_MAKER = "hybridflow.algorithms.rewards.word_arith:train_test_rows"


def word_arith_rows(seed: int, n_train: int, n_test: int, max_number: int,
                    maker: str = WORD_ARITH_MAKER, progress=None
                    ) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows) of the word-problem task (`hybridflow data
    word_arith`): chat-message prompts, GSM8K answers, for a real chat model. The
    maker refuses what its problem space cannot give before making a row;
    `progress` (given only when set) is passed on to it."""
    try:
        make = import_named(maker, "the word_arith data maker")
    except ValueError as err:
        raise DataError(str(err)) from None
    try:
        extra = {"progress": progress} if progress is not None else {}
        return make(seed, n_train, n_test, max_number, **extra)
    except ValueError as err:
        raise DataError(f"word_arith: {err}") from None


def _prompt_text(prompt, tokenizer, where: str) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple, np.ndarray)) and all(
            isinstance(m, dict) and "content" in m for m in prompt):
        messages = [dict(m) for m in prompt]
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=False)
        return "".join(str(m["content"]) for m in messages)
    raise DataError(f"{where}: 'prompt' must be a string or a list of chat messages "
                    f"({{'role', 'content'}}), got {type(prompt).__name__}")


def unknown_characters(tokenizer, text: str, ids) -> str:
    """The characters of `text` the tokenizer turns into its unknown token (they would
    train as `<unk>`), or ''; the data loader and the agent path both refuse them."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or unk not in ids:
        return ""
    return "".join(sorted({c for c in text
                           if unk in tokenizer(c, add_special_tokens=False)["input_ids"]}))


@dataclass
class PromptRow:
    text: str
    token_ids: list[int]
    data_source: str
    ground_truth: object
    extra_info: dict


def row_checker(plan, cfg) -> RowCheck | None:
    """The checks of data values that the plan's roles will need (a worker class's
    `data_row_check(cfg)`, e.g. the reward scorer's data_source and ground_truth),
    for the roles the plan calls; None when no role checks anything."""
    roles = dict.fromkeys(n.role for n in plan.nodes if n.op == Op.CALL)
    checks = []
    for role in roles:
        make = getattr(plan.bindings.get(role), "data_row_check", None)
        check = make(cfg) if callable(make) else None
        if check is not None:
            checks.append(check)
    if not checks:
        return None

    def check_all(data_source: str, ground_truth: object) -> None:
        for check in checks:
            check(data_source, ground_truth)
    return check_all


class PromptDataset:
    """Validated, tokenized prompt rows. Prompts over the limit are dropped (and
    counted) when `filter_overlong`, otherwise they are an error naming the row.
    `check_row` checks the values a role will read (see `row_checker`)."""

    def __init__(self, rows: list[dict], tokenizer, max_prompt_length: int,
                 filter_overlong: bool = True, name: str = "<rows>",
                 check_row: RowCheck | None = None):
        self.name, self.rows, self.dropped = name, [], 0
        for i, row in enumerate(rows):
            parsed = self._parse(row, tokenizer, f"{name} row {i}")
            if check_row is not None:
                try:
                    check_row(parsed.data_source, parsed.ground_truth)
                except (ValueError, TypeError) as err:
                    raise DataError(f"{name} row {i}: {err}") from None
            if len(parsed.token_ids) > max_prompt_length:
                if not filter_overlong:
                    raise DataError(f"{name} row {i}: prompt has {len(parsed.token_ids)} tokens, "
                                    f"more than data.max_prompt_length={max_prompt_length}")
                self.dropped += 1
                continue
            self.rows.append(parsed)
        if not self.rows:
            raise DataError(f"{name}: no usable rows ({len(rows)} read, {self.dropped} longer "
                            f"than data.max_prompt_length={max_prompt_length})")

    @staticmethod
    def _parse(row, tokenizer, where: str) -> PromptRow:
        if not isinstance(row, dict):
            raise DataError(f"{where}: a row must be an object, got {type(row).__name__}")
        for column in ("prompt", "data_source"):
            if column not in row:
                raise DataError(f"{where}: missing column '{column}' "
                                f"(columns: {sorted(row)})")
        reward_model = row.get("reward_model") or {}
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise DataError(f"{where}: missing column 'reward_model.ground_truth'")
        text = _prompt_text(row["prompt"], tokenizer, where)
        if not text.strip():
            raise DataError(f"{where}: empty prompt")
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        unknown = unknown_characters(tokenizer, text, ids)
        if unknown:
            raise DataError(f"{where}: the tokenizer has no token for {unknown!r} in the "
                            f"prompt {text[:60]!r}; write prompts with characters it knows "
                            f"or use a tokenizer that knows them (model.tokenizer)")
        return PromptRow(text, list(ids), str(row["data_source"]),
                         reward_model["ground_truth"], dict(row.get("extra_info") or {}))

    def __len__(self) -> int:
        return len(self.rows)

    @classmethod
    def from_file(cls, path: str, tokenizer, max_prompt_length: int, filter_overlong=True,
                  check_row: RowCheck | None = None):
        return cls(read_rows(path), tokenizer, max_prompt_length, filter_overlong, name=path,
                   check_row=check_row)


def tokenize_prompts(rows: list[PromptRow], pad_id: int, uids: list[str],
                     width: int = 0) -> Batch:
    """Left-padded prompt tensors (to the longest row, or `width` if wider) plus the
    per-row columns source nodes provide."""
    width = max(width, *(len(r.token_ids) for r in rows))
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row.token_ids)
        input_ids[i, width - n:] = torch.tensor(row.token_ids, dtype=torch.long)
        attention[i, width - n:] = 1
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return Batch({"input_ids": input_ids, "attention_mask": attention,
                  "position_ids": position_ids},
                 {"raw_prompt": [r.text for r in rows], "uid": uids,
                  "data_source": [r.data_source for r in rows],
                  "ground_truth": [r.ground_truth for r in rows],
                  "extra_info": [r.extra_info for r in rows]})


class PromptLoader:
    """Endless batches of prompts: shuffled each epoch with (seed, epoch); its
    position (epoch, cursor) is saved in checkpoints so a resumed run continues
    with the very next batch. `fixed_width` pads every batch to the dataset's longest
    prompt, so batches drawn for one step (a gather's rounds) concatenate."""

    def __init__(self, dataset: PromptDataset, batch_size: int, pad_id: int,
                 shuffle: bool = True, seed: int = 0, fixed_width: bool = False):
        if batch_size > len(dataset):
            raise DataError(f"data.batch_size={batch_size} is larger than the "
                            f"{len(dataset)} usable rows of {dataset.name}")
        self.dataset, self.batch_size, self.pad_id = dataset, batch_size, pad_id
        self.shuffle, self.seed = shuffle, seed
        self.width = max(len(r.token_ids) for r in dataset.rows) if fixed_width else 0
        self.epoch, self.cursor, self.served = 0, 0, 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed * 100003 + self.epoch).shuffle(order)
        return order

    def next_batch(self, size: int | None = None) -> Batch:
        size = size or self.batch_size
        picked = []
        while len(picked) < size:
            if self.cursor >= len(self._order):
                self.epoch, self.cursor = self.epoch + 1, 0
                self._order = self._make_order()
            picked.append(self._order[self.cursor])
            self.cursor += 1
        uids = [f"u{self.served + k}" for k in range(len(picked))]
        self.served += len(picked)
        return tokenize_prompts([self.dataset.rows[i] for i in picked], self.pad_id, uids,
                                self.width)

    def all_batches(self):
        """Every row once, in order (validation)."""
        rows = self.dataset.rows
        for start in range(0, len(rows), self.batch_size):
            chunk = rows[start:start + self.batch_size]
            yield tokenize_prompts(chunk, self.pad_id,
                                   [f"val-{start + i}" for i in range(len(chunk))])

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "served": self.served}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self.served = int(state.get("served", 0))
        self._order = self._make_order()
