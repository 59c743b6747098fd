"""Rule-based reward functions and the contract they share.

A scorer is `compute_score(data_source, solution_str, ground_truth,
extra_info=None) -> float | dict`, called by keyword; a dict carries
`"score"` plus extra values to log. Scorers read decoded strings only.
A scorer may also name any of the response facts `response_length` (tokens in
the response, EOS included) and `stopped` (it ended with EOS rather than at the
length limit) — or take `**kwargs` — and receives them; arguments from config
(`reward.kwargs`) are passed by keyword too. `call_scorer` does that passing.
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


RESPONSE_FACTS = ("response_length", "stopped")  # what a scorer may ask for besides


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict | None = None, **kwargs) -> float | dict:
    """Score with the built-in scorer registered for `data_source`; response facts it
    does not take are dropped, config arguments are passed on."""
    scorer = lookup(SCORERS, data_source, "data_source (no built-in scorer; use load_scorer)")
    facts = {k: kwargs.pop(k) for k in RESPONSE_FACTS if k in kwargs}
    sample = {"data_source": data_source, "solution_str": solution_str,
              "ground_truth": ground_truth, "extra_info": extra_info, **facts}
    return call_scorer(scorer, sample, kwargs)


def accepted_arguments(fn: Callable) -> set[str] | None:
    """The keyword names `fn` takes; None when it takes any (**kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY}


def call_scorer(fn: Callable, sample: dict, kwargs: dict | None = None):
    """`fn` called with the contract arguments, the response facts of `sample` it
    takes, and the config `kwargs` (all of them: an unknown one is an error)."""
    accepted = accepted_arguments(fn)
    args = {k: v for k, v in sample.items()
            if k not in RESPONSE_FACTS or accepted is None or k in accepted}
    return fn(**args, **(kwargs or {}))


def check_sample(data_source: str, ground_truth: Any) -> None:
    """ValueError unless a built-in scorer is registered for `data_source` and the
    ground truth is not null; TypeError unless it is the string (or number) that
    scorer compares against."""
    if data_source not in SCORERS:
        raise ValueError(f"no built-in scorer for data_source {data_source!r} (built-in: "
                         f"{', '.join(sorted(SCORERS))}); fix the data_source or set "
                         f"reward.function_path to score it with your own scorer")
    check_ground_truth(ground_truth)
    if not isinstance(ground_truth, (str, int, float)) or isinstance(ground_truth, bool):
        raise TypeError(f"ground_truth is a {type(ground_truth).__name__} "
                         f"({ground_truth!r:.60}); the built-in scorer for {data_source!r} "
                         f"compares the answer with one string or number")


def check_ground_truth(ground_truth: Any) -> None:
    """ValueError for a null ground truth: every scorer would score it 0."""
    if ground_truth is None:
        raise ValueError("ground_truth is null; every row needs the answer its reward is "
                         "scored against (reward_model.ground_truth)")


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


def _check_contract(fn: Callable, where: str, kwargs: dict | None = None) -> None:
    """TypeError unless `fn` can be called by keyword with the four contract
    arguments, the response facts it names and the config `kwargs`."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # some builtins expose no signature; nothing to check
    accepted = accepted_arguments(fn)
    facts = {k: 0 for k in RESPONSE_FACTS if accepted is not None and k in accepted}
    try:
        signature.bind(data_source="", solution_str="", ground_truth="", extra_info=None,
                       **facts, **(kwargs or {}))
    except TypeError as err:
        given = f" and reward.kwargs {sorted(kwargs)}" if kwargs else ""
        raise TypeError(f"{where} has signature {signature}, but a scorer must accept "
                        f"{_CONTRACT}{given} by keyword ({err})") from None


def load_scorer(path: str | Path, function_name: str = "compute_score",
                kwargs: dict | None = None) -> Scorer:
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
    _check_contract(fn, where, kwargs)
    return fn
