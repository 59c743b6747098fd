"""GSM8K scorer: the final answer follows `####`, as in the dataset's solutions.

Extraction (as verl's gsm8k.py): `strict` takes the number after the last
`#### ` (the model must follow the format); `flexible` takes the last number
anywhere in the text. Commas and `$` are removed, and so is a trailing period
("#### 72." is 72; verl would compare "72." and miss it).
"""
from __future__ import annotations

import re

DATA_SOURCES = ("openai/gsm8k", "gsm8k")
# Regexes over very long strings are slow and the answer sits at the end.
_CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def _normalise(number: str) -> str:
    return number.replace(",", "").replace("$", "").rstrip(".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer string found by `method` ("strict" or "flexible"), or None."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"unknown extraction method {method!r}; valid: strict, flexible")
    text = solution_str[-_CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(text)
        return _normalise(found[-1]) if found else None
    for candidate in reversed(_NUMBER.findall(text)):
        number = _normalise(candidate)
        if number not in ("", "-"):
            return number
    return None


def ground_truth_answer(ground_truth: str) -> str:
    """The reference answer; a raw GSM8K solution ("... #### 72") is reduced to "72"."""
    return _normalise(str(ground_truth).split("####")[-1].strip())


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict | None = None,
                  method: str = "strict", format_score: float = 0.0, score: float = 1.0) -> float:
    """`score` if the extracted answer equals the ground truth, `format_score` if
    an answer was found but is wrong, 0.0 if none was found."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if answer == ground_truth_answer(ground_truth) else format_score
