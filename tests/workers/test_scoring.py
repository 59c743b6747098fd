"""The engine's scorer machinery (hybridflow/workers/scoring.py): splitting a dict
score, loading a user's scorer file, calling a scorer with the arguments it takes,
and the table of scorers by data_source that config names by import path."""
import pytest

from hybridflow.workers.scoring import (ScorerTable, call_scorer, load_scorer,
                                        load_scorer_table, split_score)


def test_split_score_accepts_floats_and_dicts():
    assert split_score(1) == (1.0, {})
    assert split_score({"score": 0.5, "acc": True}) == (0.5, {"acc": True})
    with pytest.raises(ValueError, match="must include 'score'"):
        split_score({"acc": 1.0})


# ---------------------------------------------------------------- load_scorer

def _write(tmp_path, text, name="my_reward.py"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_scorer_loads_a_user_function(tmp_path):
    path = _write(tmp_path, "import dataclasses\n"
                            "@dataclasses.dataclass\nclass Detail:\n    n: int\n"
                            "def length_score(data_source, solution_str, ground_truth,\n"
                            "                 extra_info=None):\n"
                            "    return {'score': float(len(solution_str)), 'n': Detail(1).n}\n")
    fn = load_scorer(path, "length_score")
    result = fn(data_source="d", solution_str="abc", ground_truth="", extra_info=None)
    assert result == {"score": 3.0, "n": 1}


def test_load_scorer_accepts_keyword_only_and_kwargs_signatures(tmp_path):
    path = _write(tmp_path,
                  "def compute_score(*, data_source, solution_str, **rest):\n    return 1.0\n")
    scorer = load_scorer(str(path))
    assert scorer(data_source="", solution_str="", ground_truth="", extra_info=None) == 1.0


def test_load_scorer_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="scorer file not found: .*nope.py"):
        load_scorer(tmp_path / "nope.py")


def test_load_scorer_missing_function_lists_the_defined_ones(tmp_path):
    path = _write(tmp_path, "from os.path import join\n"
                            "def score_a(x):\n    pass\ndef score_b(x):\n    pass\n")
    with pytest.raises(AttributeError, match=r"defines no 'compute_score'; "
                                             r"functions defined there: score_a, score_b$"):
        load_scorer(path)


@pytest.mark.parametrize("source, message", [
    ("def compute_score(solution, truth):\n    return 0.0\n",
     r"signature \(solution, truth\).*must accept"),
    ("def compute_score(data_source, solution_str, ground_truth):\n    return 0.0\n", "extra_info"),
    ("compute_score = 3\n", r"is not callable \(it is a int\)"),
])
def test_load_scorer_rejects_a_wrong_signature(tmp_path, source, message):
    with pytest.raises(TypeError, match=message):
        load_scorer(_write(tmp_path, source))


def test_load_scorer_reports_import_errors(tmp_path):
    with pytest.raises(ImportError, match="scorer file .*broken.py' failed to import: SyntaxError"):
        load_scorer(_write(tmp_path, "def compute_score(:\n", name="broken.py"))


# ---------------------------------------------------------------- calling and tables
def _exact(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)


def _counts(data_source, solution_str, ground_truth, extra_info=None, response_length=0,
            bonus=0.0):
    return response_length + bonus


def test_call_scorer_passes_only_the_response_facts_the_scorer_names():
    sample = {"data_source": "d", "solution_str": "7", "ground_truth": "7",
              "extra_info": None, "response_length": 3, "stopped": True}
    assert call_scorer(_exact, sample) == 1.0  # takes no facts: none passed
    assert call_scorer(_counts, sample, {"bonus": 0.5}) == 3.5  # names one: gets it
    with pytest.raises(TypeError, match="unexpected"):
        call_scorer(_exact, sample, {"bonus": 1})  # a config argument it lacks is an error


def test_a_table_scores_by_data_source_and_checks_rows():
    table = ScorerTable({"exact": _exact, "count": _counts}, "mine:TABLE")
    assert table("exact", "7", "7", response_length=4, stopped=True) == 1.0
    assert table("count", "", "", response_length=4) == 4
    with pytest.raises(ValueError, match=r"no built-in scorer for data_source 'other' "
                                         r"\(built-in: count, exact\)"):
        table("other", "7", "7")
    table.check_sample("exact", 7)
    with pytest.raises(ValueError, match="ground_truth is null"):
        table.check_sample("exact", None)
    with pytest.raises(TypeError, match="ground_truth is a list"):
        table.check_sample("exact", ["7"])


def test_the_default_table_is_found_by_name_and_a_bad_name_is_reported():
    table = load_scorer_table("algorithms.rewards:SCORERS")
    assert table("toy_arith", "12", "12") == 1.0
    with pytest.raises(ValueError, match=r"reward.scorer_table='algorithms.rewards:NOPE': "
                                         r"'algorithms.rewards' defines no 'NOPE'"):
        load_scorer_table("algorithms.rewards:NOPE")
    with pytest.raises(ValueError, match="must name a mapping data_source -> scorer"):
        load_scorer_table("algorithms.rewards:compute_score")
