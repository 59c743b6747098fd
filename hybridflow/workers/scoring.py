"""The rule scorer's contract and the generic machinery around it, for any task.

A scorer is `fn(data_source, solution_str, ground_truth, extra_info=None) ->
float | dict`, called by keyword; a dict carries `"score"` plus extra values to log.
A scorer may also name any of the response facts `response_length` (tokens in the
response, EOS included) and `stopped` (it ended with EOS rather than at the length
limit), or take `**kwargs`, and receives them; config arguments (`reward.kwargs`)
are passed by keyword too (`call_scorer`).

Scorers come from a user's Python file (`load_scorer`, `reward.function_path`) or
from a table data_source -> scorer (`ScorerTable`) that the config names by import
path (`reward.scorer_table`, by default the task scorers of `algorithms/rewards`).
The engine ships no scorer. Stateless, except that a scorer file imported once stays
in `sys.modules` (dataclasses and pickling look its module up there).
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable

from hybridflow.core.names import import_named

__all__ = ["Scorer", "RESPONSE_FACTS", "DEFAULT_SCORER_TABLE", "accepted_arguments",
           "call_scorer", "split_score", "check_ground_truth", "load_scorer", "ScorerTable",
           "load_scorer_table"]

Scorer = Callable[..., "float | dict"]
RESPONSE_FACTS = ("response_length", "stopped")  # what a scorer may ask for besides
DEFAULT_SCORER_TABLE = "hybridflow.algorithms.rewards:SCORERS"  # reward.scorer_table's default
_CONTRACT = "(data_source, solution_str, ground_truth, extra_info=None)"


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


def split_score(result: float | dict) -> tuple[float, dict[str, Any]]:
    """(score, extra values to log) from a scorer's float or dict result."""
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"a scorer returning a dict must include 'score'; "
                             f"got keys {sorted(result)}")
        return float(result["score"]), {k: v for k, v in result.items() if k != "score"}
    return float(result), {}


def check_ground_truth(ground_truth: Any) -> None:
    """ValueError for a null ground truth: every scorer would score it 0."""
    if ground_truth is None:
        raise ValueError("ground_truth is null; every row needs the answer its reward is "
                         "scored against (reward_model.ground_truth)")


class ScorerTable:
    """Scores each sample with the scorer `scorers` registers for its data_source.

    The table's scorers compare the response with one answer (a string or a number);
    a task whose answers are lists or objects scores with its own scorer file
    (`reward.function_path`), which may take any ground truth."""

    def __init__(self, scorers: Mapping[str, Scorer], name: str):
        self.scorers, self.name = dict(scorers), name

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any,
                 extra_info: dict | None = None, **kwargs) -> float | dict:
        """The data_source's scorer, given the response facts it takes and the config
        arguments."""
        self.check_data_source(data_source)
        sample = {"data_source": data_source, "solution_str": solution_str,
                  "ground_truth": ground_truth, "extra_info": extra_info,
                  **{k: kwargs.pop(k) for k in RESPONSE_FACTS if k in kwargs}}
        return call_scorer(self.scorers[data_source], sample, kwargs)

    def check_data_source(self, data_source: str) -> None:
        if data_source not in self.scorers:
            raise ValueError(f"no built-in scorer for data_source {data_source!r} (built-in: "
                             f"{', '.join(sorted(self.scorers))}); fix the data_source or set "
                             f"reward.function_path to score it with your own scorer")

    def check_sample(self, data_source: str, ground_truth: Any) -> None:
        """ValueError unless a scorer is registered for `data_source` and the ground
        truth is not null; TypeError unless it is one string or number."""
        self.check_data_source(data_source)
        check_ground_truth(ground_truth)
        if not isinstance(ground_truth, (str, int, float)) or isinstance(ground_truth, bool):
            raise TypeError(f"ground_truth is a {type(ground_truth).__name__} "
                            f"({ground_truth!r:.60}); the built-in scorer for {data_source!r} "
                            f"compares the answer with one string or number")


def load_scorer_table(spec: str) -> ScorerTable:
    """The table `reward.scorer_table` names ("package.module:NAME", a mapping
    data_source -> scorer); ValueError naming the key when it is not one."""
    table = import_named(spec, "reward.scorer_table")
    if not isinstance(table, Mapping) or not all(callable(f) for f in table.values()):
        raise ValueError(f"reward.scorer_table={spec!r} must name a mapping data_source -> "
                         f"scorer function, got {type(table).__name__}")
    return ScorerTable(table, spec)


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
    from hybridflow.core.user_code import import_user_file
    file = Path(path)
    if not file.exists():
        raise FileNotFoundError(f"scorer file not found: {file} (resolved: {file.resolve()})")
    module = import_user_file(str(file), "scorer file", ImportError)
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
