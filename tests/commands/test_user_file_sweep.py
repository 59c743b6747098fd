"""Issue 26, classes 1 and 2: every kind of file the project reads, damaged every way
(missing, empty, truncated, random bytes, not UTF-8, the wrong JSON/YAML type, a
directory or a FIFO in its place), through the command that reads it, ends in one line
that names the file -- never a traceback, a hang, or "does not exist" for what exists.

Each case runs the CLI in this process (`hybridflow.cli.main`); a FIFO opened by
mistake would block, so every case runs under an alarm."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

import pytest

from tests.support.cli_run import message_lines, run_cli
from tests.support.corrupt import CORRUPTIONS, corrupt
from tests.support.recorded_runs import REPO, fabricate_run, graph_path, remanifest

TOY = os.path.join(REPO, "graphs", "assets", "toy_base")
GRPO = graph_path("grpo.py")
ROW = (b'{"data_source": "toy", "prompt": "1+2=", "ability": "math", '
       b'"reward_model": {"ground_truth": "3"}, "extra_info": {}}\n')


@dataclass
class Kind:
    """A file the project reads: where it lies in a prepared folder, its valid content,
    content of the wrong type, the command that reads it, and what that command may
    take as fine (e.g. a run without status.json has not started)."""
    name: str
    setup: object  # (tmp) -> (path of the file, argv)
    valid: bytes = b""  # b"": the file's own content before damage
    wrong: bytes | None = None
    accepted: tuple[str, ...] = ()  # corruptions the command rightly accepts
    names: str = ""  # what the line must name instead of the file's basename
    cases: tuple[str, ...] = field(default=CORRUPTIONS)


def _model_dir(tmp):
    folder = tmp / "model"
    shutil.copytree(TOY, folder)
    return folder


def _graph_file(tmp):
    path = tmp / "g.py"
    shutil.copy(GRPO, path)
    return path, ["check", str(path)]


def _worker_file(tmp):
    path = tmp / "my_workers.py"
    path.write_text("from hybridflow.workers import DEFAULT_ROLES\n"
                    "Actor = DEFAULT_ROLES['actor']\n")
    return path, ["check", GRPO, f"workers.actor={path}:Actor"]


def _scorer_file(tmp):
    path = tmp / "score.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, "
                    "extra_info=None):\n    return 1.0\n")
    return path, ["check", GRPO, f"reward.function_path={path}"]


def _env_file(tmp):
    path = tmp / "env.py"  # the factory last, so a truncated file loses it
    path.write_text("from graphs.envs.calculator import make_env as shipped\n\n\n"
                    "def make_env():\n    return shipped()\n")
    return path, ["check", graph_path("agent_grpo.py"), f"agent.env={path}:make_env"]


def _yaml(tmp):
    path = tmp / "c.yaml"
    path.write_text("trainer:\n  steps: 3\n  seed: 2\ndata:\n  batch_size: 4\n")
    return path, ["check", GRPO, "--config", str(path)]


def _run_args(tmp, *extra):
    return ["run", GRPO, f"trainer.runs_dir={tmp / 'runs'}", "trainer.steps=1",
            "trainer.val_every=0", "trainer.progress=false", *extra]


def _jsonl_data(tmp):
    path = tmp / "train.jsonl"
    path.write_bytes(ROW * 8)
    return path, _run_args(tmp, f"data.train_files={path}")


def _parquet_data(tmp):
    import json

    from hybridflow.core.data import write_rows
    path = tmp / "train.parquet"
    write_rows([{**json.loads(ROW), "extra_info": {"index": i}} for i in range(8)], str(path))
    return path, _run_args(tmp, f"data.train_files={path}")


def _model_config(tmp):
    folder = _model_dir(tmp)
    return folder / "config.json", ["check", GRPO, f"model.path={folder}"]


def _model_config_memory(tmp):
    path, argv = _model_config(tmp)
    return path, [*argv, "--memory"]


def _weights(tmp):
    folder = _model_dir(tmp)
    return folder / "model.safetensors", ["check", GRPO, f"model.path={folder}"]


def _tokenizer(tmp):
    folder = _model_dir(tmp)
    return folder / "tokenizer.json", ["check", GRPO, f"model.path={folder}"]


def _plan_model(tmp):
    folder = _model_dir(tmp)
    return folder / "config.json", ["plan", GRPO, "--model", str(folder / "config.json")]


def _device_entry(tmp):
    import dataclasses
    import json

    from hybridflow.planner import get_device
    path = tmp / "box.json"
    entry = dataclasses.asdict(get_device("cpu"))
    path.write_text(json.dumps(entry))
    return path, ["plan", GRPO, "--device", str(path)]


def _run_file(name, *argv_of):
    def setup(tmp):
        folder = fabricate_run(tmp / "run")
        argv = [a.format(run=folder, out=tmp / "out", graph=GRPO) for a in argv_of]
        return tmp / "run" / name, argv
    return setup


def _running_lock(tmp):
    import json
    folder = fabricate_run(tmp / "run")
    with open(os.path.join(folder, "status.json"), "w") as handle:
        json.dump({"state": "running", "time": 0.0, "step": 1, "steps": 3}, handle)
    path = tmp / "run" / "lock.json"
    path.write_text(json.dumps({"pid": 1, "host": "h", "started": 0.0}))
    return path, ["status", folder]


def _manifest(tmp):
    folder = fabricate_run(tmp / "run")
    return (tmp / "run" / "checkpoints" / "step_000003" / "manifest.json",
            ["export", folder, str(tmp / "out")])


_JSON_LIST = b"[1, 2, 3]\n"
_CALIBRATE = ("plan", "--calibrate", "{run}", "--device", "cpu")
_TIMELINE = ("render", "--timeline", "{run}", "-o", "{out}.svg")
_PY = tuple(c for c in CORRUPTIONS if c != "wrong_type")  # Python files have no JSON type
KINDS = [
    Kind("graph file", _graph_file, cases=_PY),
    Kind("worker file", _worker_file, cases=_PY),
    Kind("scorer file", _scorer_file, cases=_PY),
    Kind("environment file", _env_file, cases=_PY),
    Kind("YAML config", _yaml, wrong=b"- trainer\n- data\n"),
    Kind("JSONL data", _jsonl_data, wrong=ROW + _JSON_LIST),
    Kind("parquet data", _parquet_data, cases=tuple(c for c in CORRUPTIONS
                                                    if c not in ("non_utf8", "wrong_type"))),
    Kind("model config.json", _model_config, wrong=_JSON_LIST),
    Kind("model config.json (check --memory)", _model_config_memory, wrong=_JSON_LIST),
    Kind("model config.json (plan --model)", _plan_model, wrong=_JSON_LIST),
    Kind("model safetensors", _weights, wrong=(7).to_bytes(8, "little") + b"[1,2,3]",
         names="model"),  # a missing weights file: the directory has none
    Kind("tokenizer.json", _tokenizer, wrong=_JSON_LIST, accepted=("missing",)),
    Kind("device entry", _device_entry, wrong=_JSON_LIST),
    Kind("status.json", _run_file("status.json", "status", "{run}"), wrong=_JSON_LIST,
         accepted=("missing",)),  # no status.json: the run never started (and says so)
    Kind("lock.json", _running_lock, wrong=_JSON_LIST,
         accepted=("missing",)),  # no lock: the run's process is gone (and says so)
    Kind("config.yaml (calibrate)", _run_file("config.yaml", *_CALIBRATE),
         wrong=b"- trainer\n"),
    Kind("plan.json (calibrate)", _run_file("plan.json", *_CALIBRATE), wrong=_JSON_LIST),
    Kind("timeline.jsonl (calibrate)", _run_file("timeline.jsonl", *_CALIBRATE),
         wrong=_JSON_LIST),
    Kind("metrics.jsonl (calibrate)", _run_file("metrics.jsonl", *_CALIBRATE),
         wrong=_JSON_LIST),
    Kind("timeline.jsonl (render)", _run_file("timeline.jsonl", *_TIMELINE),
         wrong=_JSON_LIST),
    Kind("config.yaml (render)", _run_file("config.yaml", *_TIMELINE), wrong=b"- trainer\n",
         accepted=("missing",)),  # a timeline alone is drawn (nothing says it ran async)
    Kind("graph.json (resume)", _run_file("graph.json", "run", "{graph}", "--resume", "{run}"),
         wrong=_JSON_LIST,  # a missing one (an older run) is a note, then the run resumes
         cases=tuple(c for c in CORRUPTIONS if c != "missing")),
    Kind("checkpoint manifest (export)", _manifest, wrong=_JSON_LIST,
         names="step_000003"),  # a missing manifest: the checkpoint is incomplete
]
CASES = [pytest.param(kind, how, id=f"{kind.name}-{how}")
         for kind in KINDS for how in kind.cases]


def _checkpoint_file(name):
    def setup(tmp):
        folder = fabricate_run(tmp / "run")
        return (tmp / "run" / "checkpoints" / "step_000003" / name,
                ["run", GRPO, "--resume", folder])
    return setup


# read by a resume once the workers are up (seconds each): the slow part of the sweep
RESUME_KINDS = [
    Kind("checkpoint state (resume)", _checkpoint_file("trainer_state.json"),
         wrong=_JSON_LIST, cases=tuple(c for c in CORRUPTIONS if c != "missing")),
    Kind("checkpoint RNG state (resume)", _checkpoint_file("rng_torch.safetensors"),
         wrong=(7).to_bytes(8, "little") + b"[1,2,3]",
         cases=tuple(c for c in CORRUPTIONS if c != "missing")),
]
RESUME_CASES = [pytest.param(kind, how, id=f"{kind.name}-{how}")
                for kind in RESUME_KINDS for how in kind.cases]


@pytest.mark.parametrize("kind,how", CASES)
def test_a_damaged_file_ends_in_one_line_naming_it(kind, how, tmp_path, capsys):
    check_damage(kind, how, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("kind,how", RESUME_CASES)
def test_a_damaged_checkpoint_file_ends_a_resume_in_one_line_naming_it(kind, how, tmp_path,
                                                                       capsys):
    check_damage(kind, how, tmp_path, capsys)


def check_damage(kind: Kind, how: str, tmp_path, capsys) -> None:
    path, argv = kind.setup(tmp_path)
    corrupt(str(path), how, kind.valid or path.read_bytes(), kind.wrong)
    if "checkpoints" in str(path) and how not in ("missing", "directory", "fifo"):
        remanifest(os.path.dirname(path)) if path.name != "manifest.json" else None
    code, err = run_cli(argv, capsys)
    if how in kind.accepted:
        assert "Traceback" not in err, err
        return
    lines = message_lines(err)
    assert code != 0, f"accepted a {how} {kind.name}: {err}"
    assert len(lines) == 1 and lines[0].startswith(f"hybridflow {argv[0]}: "), err
    assert (kind.names or path.name) in lines[0], lines[0]
    if how in ("directory", "fifo"):
        assert "does not exist" not in lines[0], lines[0]


def test_the_sweep_covers_every_kind_and_corruption():
    """The count the issue's note reports (and a guard against a kind losing its cases)."""
    assert len(KINDS) == 23 and len(CASES) >= 170 and len(RESUME_CASES) == 14
