"""Issue 32, class 8: messages that mislead.

- Every YAML and JSON file a command reads, with a syntax error, names the problem,
  its line and its column (a regression had left only "while parsing a flow sequence").
- A missing local model directory suggests the project's own command; a hub id the
  hub's download.
- The docs state the defaults the code has (runtime.torch_threads), and every metric
  the code logs has its unit and scope in one table (docs/cli.md)."""
from __future__ import annotations

import os
import re
import shutil

import pytest

from tests.support.cli_run import message_lines, run_cli
from tests.support.recorded_runs import REPO, fabricate_run, graph_path

GRPO = graph_path("grpo.py")
BAD_YAML = b"trainer:\n  steps: [1, 2\n  seed: 3\n"  # an unclosed flow sequence
BAD_JSON = b'{"state": "finished",\n "step": 3,,\n "steps": 3}\n'
BAD_JSONL = b'{"step": 1, "x": 1.0}\n{"step": 2, "x": }\n'


def _config(command):
    def setup(tmp):
        path = tmp / "c.yaml"
        extra = {"render": ["-o", tmp / "g.svg"]}.get(command, [])
        return path, BAD_YAML, [command, GRPO, "--config", path, *extra]
    return setup


def _run_file(name, bad, *argv):
    def setup(tmp):
        folder = fabricate_run(tmp / "run")
        return (tmp / "run" / name, bad,
                [a.format(run=folder, out=tmp / "t.svg") for a in argv])
    return setup


def _model_config(tmp):
    folder = tmp / "model"
    shutil.copytree(os.path.join(REPO, "graphs", "assets", "toy_base"), folder)
    return folder / "config.json", BAD_JSON, ["check", GRPO, f"model.path={folder}"]


_CALIBRATE = ("plan", "--calibrate", "{run}", "--device", "cpu")
READS = {
    "check --config": _config("check"), "run --config": _config("run"),
    "plan --config": _config("plan"), "render --config": _config("render"),
    "run config.yaml (calibrate)": _run_file("config.yaml", BAD_YAML, *_CALIBRATE),
    "status.json (status)": _run_file("status.json", BAD_JSON, "status", "{run}"),
    "plan.json (calibrate)": _run_file("plan.json", BAD_JSON, *_CALIBRATE),
    "metrics.jsonl (calibrate)": _run_file("metrics.jsonl", BAD_JSONL, *_CALIBRATE),
    "timeline.jsonl (render)": _run_file("timeline.jsonl", BAD_JSONL, "render",
                                         "--timeline", "{run}", "-o", "{out}"),
    "model config.json (check)": _model_config,
}


@pytest.mark.parametrize("name", list(READS))
def test_a_syntax_error_names_the_problem_line_and_column(name, tmp_path, capsys):
    path, bad, argv = READS[name](tmp_path)
    path.write_bytes(bad)
    code, err = run_cli(argv, capsys)
    lines = message_lines(err)
    assert code != 0 and len(lines) == 1 and "Traceback" not in err, err
    line = lines[0]
    assert path.name in line and re.search(r"line 2\b", line) and "column" in line, line
    if bad is BAD_YAML:
        assert "expected" in line, line  # the problem, not only the parser's context


def test_a_missing_local_model_directory_suggests_the_projects_command(capsys):
    yaml = os.path.join(REPO, "graphs", "configs", "smollm2_arith.yaml")
    cwd = os.getcwd()
    os.chdir(os.path.dirname(os.path.dirname(GRPO)) + "/graphs/assets")  # no models/ here
    try:
        code, err = run_cli(["check", GRPO, "--config", yaml], capsys)
    finally:
        os.chdir(cwd)
    assert code == 1
    assert "hybridflow model smollm2 --out models/smollm2" in err, err
    assert "huggingface-cli" not in err, err


def test_a_hub_id_still_gets_the_hubs_download(capsys):
    code, err = run_cli(["check", GRPO, "model.path=Qwen/Qwen2.5-0.5B"], capsys)
    assert code == 1 and "huggingface-cli download Qwen/Qwen2.5-0.5B" in err, err
    assert "hybridflow model gguf" in err  # and how to make a local one


def _doc(name: str) -> str:
    with open(os.path.join(REPO, "docs", name), encoding="utf-8") as handle:
        return handle.read()


def test_the_docs_give_the_torch_threads_default_the_code_has():
    from hybridflow.core.runtime_section import RuntimeConfig
    assert RuntimeConfig().torch_threads is None  # None: the local runtime's cores
    for doc in ("cli.md", "real_model.md"):
        assert "os.sched_getaffinity" in _doc(doc), doc
    assert "torch_threads` (torch threads of each Ray worker process, and of the process " \
           "the local runtime runs in; default 1)" not in _doc("cli.md")


_FAMILIES = ("actor", "critic", "rollout", "async", "perf", "runtime", "engine", "reward",
             "agent", "data", "dapo", "off_policy", "timing_s", "response_length")
_KEY = re.compile(r"""["'](?:f["'])?((?:%s)/[\w@/{}.]+)["']""" % "|".join(_FAMILIES))


def _documented() -> list[re.Pattern]:
    section = _doc("cli.md").split("### Metrics: unit and scope", 1)[1].split("\n## ", 1)[0]
    keys = re.findall(r"^\| (.+?) \|", section, re.M)
    patterns = []
    for cell in keys:
        for key in re.findall(r"`([^`]+)`", cell):
            regex = re.escape(key).replace("<role>", "(?:actor|critic|rollout|ref|reward)")
            regex = re.sub(r"<[a-z_]+>", r"[^/]+", regex)
            patterns.append(re.compile(f"(?:{regex})$"))
    return patterns


def test_every_metric_the_code_logs_has_a_unit_and_scope_in_the_table():
    patterns = _documented()
    assert len(patterns) > 60
    found = set()
    for folder in ("hybridflow", "graphs", "algorithms"):
        for path in sorted(__import__("glob").glob(os.path.join(REPO, folder, "**", "*.py"),
                                                  recursive=True)):
            with open(path, encoding="utf-8") as handle:
                found |= {key for key in _KEY.findall(handle.read())
                          if "{" not in key and not key.endswith("/")}
    found -= {"data/toy", "data/word_arith"}  # `hybridflow data`'s default folders
    found -= {"perf/mfu"}  # a worker's key, logged only as perf/mfu/<node> (metric_names)
    found |= {"async/stream/mixed_rows", "async/mixed_version_rows"}  # the pair
    missing = sorted(k for k in found if not any(p.match(k) for p in patterns))
    assert not missing, f"metrics without a row in docs/cli.md's metrics table: {missing}"
    assert len(found) > 40
