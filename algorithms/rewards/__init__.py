"""Rule-based reward functions and the contract they share.

A scorer is `compute_score(data_source, solution_str, ground_truth,
extra_info=None) -> float | dict`, called by keyword; a dict carries
`"score"` plus extra values to log. Scorers read decoded strings only.
`compute_score` here dispatches on `data_source` to the built-in scorers;
`load_scorer` loads a user's scorer from a Python file.
"""
from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Callable

from algorithms.registry import lookup
from algorithms.rewards import gsm8k, toy

Scorer = Callable[..., "float | dict"]
SCORERS: dict[str, Scorer] = {toy.DATA_SOURCE: toy.compute_score}
SCORERS.update({source: gsm8k.compute_score for source in gsm8k.DATA_SOURCES})
_CONTRACT = "(data_source, solution_str, ground_truth, extra_info=None)"


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict | None = None) -> float | dict:
    """Score with the built-in scorer registered for `data_source`."""
    scorer = lookup(SCORERS, data_source, "data_source (no built-in scorer; use load_scorer)")
    return scorer(data_source=data_source, solution_str=solution_str,
                  ground_truth=ground_truth, extra_info=extra_info)


def split_score(result: float | dict) -> tuple[float, dict[str, Any]]:
    """(score, extra values to log) from a scorer's float or dict result."""
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"a scorer returning a dict must include 'score'; "
                             f"got keys {sorted(result)}")
        return float(result["score"]), {k: v for k, v in result.items() if k != "score"}
    return float(result), {}


def _import_file(file: Path):
    """Import a Python file as a module named uniquely after its absolute path."""
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:10]
    name = f"_user_scorer_{file.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import scorer file {file}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up here
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        raise ImportError(f"importing scorer file {file} failed: "
                          f"{type(err).__name__}: {err}") from err
    return module


def _check_contract(fn: Callable, where: str) -> None:
    """TypeError unless `fn` can be called by keyword with the four contract arguments."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # some builtins expose no signature; nothing to check
    try:
        signature.bind(data_source="", solution_str="", ground_truth="", extra_info=None)
    except TypeError as err:
        raise TypeError(f"{where} has signature {signature}, but a scorer must accept "
                        f"{_CONTRACT} by keyword ({err})") from None


def load_scorer(path: str | Path, function_name: str = "compute_score") -> Scorer:
    """Load `function_name` from the Python file at `path` and check its signature.

    Raises FileNotFoundError (no such file), ImportError (the file fails to
    import), AttributeError (no such function; lists the ones defined there)
    or TypeError (not callable, or a signature that does not fit the contract).
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"scorer file not found: {file} (resolved: {file.resolve()})")
    module = _import_file(file)
    where = f"{function_name!r} in {file}"
    if not hasattr(module, function_name):
        defined = sorted(n for n, v in vars(module).items()
                         if inspect.isfunction(v) and v.__module__ == module.__name__)
        raise AttributeError(f"{file} defines no {function_name!r}; functions defined there: "
                             f"{', '.join(defined) or 'none'}")
    fn = getattr(module, function_name)
    if not callable(fn):
        raise TypeError(f"{where} is not callable (it is a {type(fn).__name__})")
    _check_contract(fn, where)
    return fn
