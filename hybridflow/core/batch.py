"""Batch: named tensors that share a first dimension, plus non-tensor arrays and meta.

A Batch is what flows along the edges of a graph. Rows are samples; every tensor
and every non-tensor array (numpy object arrays: strings, ids, ground truths) has
the same number of rows. `meta` carries small Python values (metrics, flags) and is
never split: every chunk gets a copy.

Serialisation is cheap on purpose: under pickle protocol 5 (used by Ray) each tensor
goes as its raw bytes (`pickle.PickleBuffer`, moved out of band) with its dtype and
shape, so a batch crosses process boundaries with one memcpy per tensor and no
per-element Python pickling; older protocols get the tensors as numpy arrays.
"""
from __future__ import annotations

import pickle
from typing import Any, Iterable, Sequence

import numpy as np
import torch

__all__ = ["Batch", "split_indices", "as_object_array"]


def _rows_of(value: Any) -> int:
    return int(value.shape[0]) if value.ndim > 0 else 0


def as_object_array(value: Any) -> np.ndarray:
    """A non-tensor column as Batch keeps it: a numpy object array (as it is if it
    already is one)."""
    if isinstance(value, np.ndarray) and value.dtype == object:
        return value
    out = np.empty(len(value), dtype=object)
    out[:] = list(value)
    return out


class Batch:
    """Rows of named tensors (`tensors`) and named object arrays (`non_tensors`)."""

    __slots__ = ("tensors", "non_tensors", "meta")

    def __init__(self, tensors: dict | None = None, non_tensors: dict | None = None,
                 meta: dict | None = None):
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})
        self.non_tensors: dict[str, np.ndarray] = {
            k: as_object_array(v) for k, v in (non_tensors or {}).items()}
        self.meta: dict[str, Any] = dict(meta or {})
        self._check_rows()

    # ----------------------------------------------------------------- basics
    @classmethod
    def _trusted(cls, tensors: dict, non_tensors: dict, meta: dict | None) -> "Batch":
        """A Batch from columns already known to agree on rows, non-tensors already
        object arrays (rows taken, columns selected or batches concatenated from
        valid Batches): the constructor's checks, skipped on the hot path."""
        out = cls.__new__(cls)
        out.tensors, out.non_tensors, out.meta = tensors, non_tensors, dict(meta or {})
        return out

    def _check_rows(self) -> None:
        rows = None
        for columns in (self.tensors, self.non_tensors):
            for value in columns.values():
                n = _rows_of(value)
                if rows is None:
                    rows = n
                elif n != rows:
                    sizes = {k: _rows_of(v)
                             for k, v in {**self.tensors, **self.non_tensors}.items()}
                    raise ValueError(f"Batch columns disagree on the number of rows: {sizes}")

    def __len__(self) -> int:
        for value in self.tensors.values():
            return _rows_of(value)
        for value in self.non_tensors.values():
            return len(value)
        return 0

    def keys(self) -> list[str]:
        return [*self.tensors, *self.non_tensors]

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.non_tensors

    def __getitem__(self, item):
        if isinstance(item, str):
            if item in self.tensors:
                return self.tensors[item]
            if item in self.non_tensors:
                return self.non_tensors[item]
            raise KeyError(f"Batch has no key {item!r}; it has {sorted(self.keys())}")
        return self.take(item)

    def __setitem__(self, key: str, value) -> None:
        if len(self.keys()) and _rows_of(np.asarray(value) if not torch.is_tensor(value)
                                         else value) != len(self):
            raise ValueError(f"column {key!r} has {len(value)} rows, batch has {len(self)}")
        self.drop(key)
        if torch.is_tensor(value):
            self.tensors[key] = value
        else:
            self.non_tensors[key] = as_object_array(value)

    def drop(self, *keys: str) -> "Batch":
        for key in keys:
            self.tensors.pop(key, None)
            self.non_tensors.pop(key, None)
        return self

    def get(self, key: str, default=None):
        return self[key] if key in self else default

    def __repr__(self) -> str:
        cols = [f"{k}:{tuple(v.shape)}:{str(v.dtype).replace('torch.', '')}"
                for k, v in self.tensors.items()]
        cols += [f"{k}:obj" for k in self.non_tensors]
        return f"Batch(rows={len(self)}, {', '.join(cols)})"

    @property
    def nbytes(self) -> int:
        """Bytes held by tensor payloads (non-tensor arrays are counted by pickled size)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    # ------------------------------------------------------------ selection
    def select(self, *keys: str, strict: bool = True) -> "Batch":
        missing = [k for k in keys if k not in self]
        if strict and missing:
            raise KeyError(f"Batch has no key(s) {missing}; it has {sorted(self.keys())}")
        return Batch._trusted({k: v for k, v in self.tensors.items() if k in keys},
                              {k: v for k, v in self.non_tensors.items() if k in keys},
                              self.meta)

    def pop(self, *keys: str) -> "Batch":
        out = self.select(*keys)
        self.drop(*keys)
        return out

    def take(self, index) -> "Batch":
        """Rows by int, slice, list, numpy or torch index."""
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            index = int(index)
            if not -len(self) <= index < len(self):
                raise IndexError(f"row {index} is out of range for a batch of {len(self)}")
            index = slice(index, index + 1) if index != -1 else slice(index, None)
        if torch.is_tensor(index):
            index = index.cpu().numpy()
        if isinstance(index, slice) and (index.step or 1) < 0:
            index = np.arange(len(self))[index]  # torch cannot slice backwards
        if isinstance(index, (list, tuple)):  # [] would become a float tensor
            index = np.asarray(index) if len(index) else np.zeros(0, dtype=np.int64)
        np_index = index
        t_index = torch.as_tensor(np.ascontiguousarray(index)) \
            if isinstance(index, np.ndarray) else index
        return Batch._trusted({k: v[t_index] for k, v in self.tensors.items()},
                              {k: v[np_index] for k, v in self.non_tensors.items()},
                              self.meta)

    # ------------------------------------------------------- combine / split
    def union(self, other: "Batch") -> "Batch":
        """Columns of both; a key present in both must hold equal values."""
        if self.keys() and other.keys() and len(self) != len(other):
            raise ValueError(f"cannot union batches of {len(self)} and {len(other)} rows")
        for key in set(self.tensors) & set(other.tensors):
            a, b = self.tensors[key], other.tensors[key]
            if a.shape != b.shape or not torch.equal(a, b):
                raise ValueError(f"cannot union batches: key {key!r} differs "
                                 f"({tuple(a.shape)} vs {tuple(b.shape)})")
        for key in set(self.non_tensors) & set(other.non_tensors):
            if not np.array_equal(self.non_tensors[key], other.non_tensors[key]):
                raise ValueError(f"cannot union batches: key {key!r} differs")
        for key in set(self.tensors) & set(other.non_tensors) | \
                set(self.non_tensors) & set(other.tensors):
            raise ValueError(f"cannot union batches: key {key!r} is a tensor in one "
                             f"and a non-tensor array in the other")
        return Batch({**self.tensors, **other.tensors},
                     {**self.non_tensors, **other.non_tensors}, {**self.meta, **other.meta})

    def update(self, other: "Batch") -> "Batch":
        """Columns of both; `other` wins where a key is in both (a declared overwrite)."""
        return Batch({**self.tensors, **other.tensors},
                     {**self.non_tensors, **other.non_tensors}, {**self.meta, **other.meta})

    @staticmethod
    def concat(batches: Sequence["Batch"]) -> "Batch":
        meta = next((b.meta for b in batches if b is not None), {})
        batches = [b for b in batches if b is not None and b.keys()]  # keyless: no rows
        if not batches:
            return Batch(meta=meta)
        first = batches[0]
        for b in batches[1:]:
            if set(b.keys()) != set(first.keys()):
                raise ValueError(f"cannot concat batches with different keys: "
                                 f"{sorted(first.keys())} vs {sorted(b.keys())}")
        tensors = {k: torch.cat([b.tensors[k] for b in batches]) for k in first.tensors}
        non_tensors = {k: np.concatenate([b.non_tensors[k] for b in batches])
                       for k in first.non_tensors}
        return Batch._trusted(tensors, non_tensors, meta)

    def split(self, n: int, group_by: str | None = None) -> list["Batch"]:
        """n chunks in row order; uneven sizes differ by at most one row (or one group).
        Every chunk owns its rows (a copy, never a view of this batch)."""
        if group_by is not None:
            return [self.take(idx) for idx in split_indices(self, n, group_by)]
        return [self._copy_rows(a, b) for a, b in _even_bounds(len(self), n)]

    def _copy_rows(self, start: int, stop: int) -> "Batch":
        """Rows [start, stop) as fresh memory: what `take` of their indices gives,
        without building an index."""
        return Batch._trusted(
            {k: _fresh_rows(v, start, stop) for k, v in self.tensors.items()},
            {k: v[start:stop].copy() for k, v in self.non_tensors.items()}, self.meta)

    def chunk(self, n: int) -> list["Batch"]:
        return self.split(n)

    def repeat(self, n: int, interleave: bool = True) -> "Batch":
        """Each row n times: `aabb` when interleaved, `abab` otherwise."""
        rows = np.arange(len(self))
        index = np.repeat(rows, n) if interleave else np.tile(rows, n)
        return self.take(index)

    def to(self, device) -> "Batch":
        return Batch({k: v.to(device) for k, v in self.tensors.items()},
                     self.non_tensors, self.meta)

    # --------------------------------------------------------- serialisation
    def __reduce__(self):
        arrays = {k: _tensor_to_numpy(v) for k, v in self.tensors.items()}
        return (_rebuild_batch, (arrays, self.non_tensors, self.meta))

    def __reduce_ex__(self, protocol):
        """Protocol 5 (Ray's): each tensor's bytes as a `PickleBuffer` with its dtype
        and shape, not a numpy array, whose own reduce costs Ray's cloudpickle two
        module lookups per tensor (half of a small batch's pickling); older protocols
        (deepcopy, torch.save) take `__reduce__`."""
        if protocol < 5:
            return self.__reduce__()
        columns = tuple((k, *_tensor_buffer(v)) for k, v in self.tensors.items())
        return (_rebuild_from_buffers, (columns, self.non_tensors or None, self.meta or None))


def _fresh_rows(t: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows [start, stop) of `t` copied into contiguous memory (rows of a contiguous
    tensor are contiguous already: a plain clone, without the memory-format call)."""
    rows = t[start:stop]
    if rows.is_contiguous():
        return rows.clone()
    return rows.clone(memory_format=torch.contiguous_format)


def _tensor_to_numpy(t: torch.Tensor):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bf16: move the bits as int16
        return ("bf16", t.view(torch.int16).numpy())
    return ("np", t.numpy())


def _numpy_to_tensor(item) -> torch.Tensor:
    tag, arr = item
    if not arr.flags.writeable:  # buffers from Ray's object store are read-only
        arr = arr.copy()
    t = torch.from_numpy(arr)
    return t.view(torch.bfloat16) if tag == "bf16" else t


def _rebuild_batch(arrays, non_tensors, meta) -> Batch:
    return Batch({k: _numpy_to_tensor(v) for k, v in arrays.items()}, non_tensors, meta)


def _tensor_buffer(t: torch.Tensor) -> tuple:
    """(buffer, numpy dtype string, shape, is bf16) of a tensor's contiguous bytes."""
    tag, arr = _tensor_to_numpy(t)
    return pickle.PickleBuffer(arr), arr.dtype.str, arr.shape, tag == "bf16"


def _rebuild_from_buffers(columns, non_tensors, meta) -> Batch:
    tensors = {}
    for key, buffer, dtype, shape, bf16 in columns:
        arr = np.frombuffer(buffer, dtype=dtype).reshape(shape)
        if not arr.flags.writeable:  # buffers from Ray's object store are read-only
            arr = arr.copy()
        t = torch.from_numpy(arr)
        tensors[key] = t.view(torch.bfloat16) if bf16 else t
    # the columns of a Batch that was valid when pickled
    return Batch._trusted(tensors, non_tensors or {}, meta)


def _even_bounds(rows: int, n: int) -> list[tuple[int, int]]:
    """(start, stop) of n contiguous chunks, as `np.array_split` cuts them: the first
    `rows % n` chunks hold one row more."""
    if n < 1:
        raise ValueError(f"cannot split into {n} chunks")
    size, extra = divmod(rows, n)
    bounds, start = [], 0
    for i in range(n):
        stop = start + size + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _balanced_cuts(weights: list[int], n: int) -> list[int]:
    """Cut a sequence of weights into n contiguous runs with near-equal sums."""
    total, cuts, acc, start = sum(weights), [], 0, 0
    for part in range(1, n):
        target = total * part / n
        i = start
        while i < len(weights) and acc + weights[i] / 2 <= target:
            acc += weights[i]
            i += 1
        cuts.append(i)
        start = i
    return cuts


def split_indices(batch: Batch, n: int, group_by: str | None = None) -> list[np.ndarray]:
    """Row indices of n chunks. With `group_by`, no group is ever split across chunks.

    Groups are taken in order of first appearance and cut into contiguous runs of
    near-equal row counts, so for batches whose groups are contiguous (what
    `repeat(interleave=True)` produces) concatenating the chunks restores row order.
    """
    if n < 1:
        raise ValueError(f"cannot split into {n} chunks")
    rows = len(batch)
    if group_by is None:
        return [np.arange(a, b, dtype=np.int64) for a, b in _even_bounds(rows, n)]
    if group_by not in batch:
        raise KeyError(f"cannot split by group: batch has no key {group_by!r}")
    groups: dict[Any, list[int]] = {}
    for i, gid in enumerate(_group_ids(batch[group_by])):
        groups.setdefault(gid, []).append(i)
    members = list(groups.values())
    cuts = [0, *_balanced_cuts([len(m) for m in members], n), len(members)]
    return [np.asarray([i for m in members[a:b] for i in m], dtype=np.int64)
            for a, b in zip(cuts[:-1], cuts[1:])]


def _group_ids(column) -> Iterable:
    if torch.is_tensor(column):
        return column.tolist()
    return column.tolist() if isinstance(column, np.ndarray) else list(column)
