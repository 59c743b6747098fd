"""The one line a console shows for an exception: the root cause's `Type: message`,
whole, without colour codes, whatever wrapped it."""
import errno
import pickle

from hybridflow.core.failure_text import cause_line, strip_ansi, traceback_cause
from hybridflow.runtime.worker_errors import WorkerError


def _raised(err: BaseException) -> BaseException:
    try:
        raise err
    except BaseException as caught:  # noqa: BLE001 - with its traceback
        return caught


def test_a_plain_exception_is_its_type_and_first_line():
    assert cause_line(ValueError("bad value\nmore detail")) == "ValueError: bad value"
    assert cause_line(KeyError("k")) == "KeyError: 'k'"
    assert cause_line(RuntimeError()) == "RuntimeError"


def test_a_full_disk_names_the_file_and_the_cause():
    err = OSError(errno.ENOSPC, "No space left on device", "/runs/r/ckpt/__0_0.distcp")
    assert cause_line(err) == "OSError: No space left on device: /runs/r/ckpt/__0_0.distcp"


def test_ray_colour_codes_are_removed_everywhere():
    coloured = "\x1b[36mray::FusedWorker.call()\x1b[39m (pid=12, ip=127.0.0.1)"
    assert strip_ansi(coloured) == "ray::FusedWorker.call() (pid=12, ip=127.0.0.1)"
    assert "\x1b" not in cause_line(RuntimeError(coloured))


def test_torch_dcp_checkpoint_exception_is_unwrapped_to_the_failed_rank():
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception
    inner = _raised(OSError(errno.ENOSPC, "No space left on device", "/r/__0_0.distcp"))
    outer = CheckpointException("save", {0: _wrap_exception(inner)})
    assert not isinstance(outer, Exception)  # a BaseException: why run.py catches those
    assert cause_line(outer) == "OSError: No space left on device: /r/__0_0.distcp"


def test_a_ray_task_error_gives_the_worker_s_own_line():
    import ray.exceptions
    shipped = WorkerError("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                          "    result = fu\nZeroDivisionError: division by zero",
                          "ZeroDivisionError: division by zero")
    err = ray.exceptions.RayTaskError("call", "\x1b[31mtraceback text\x1b[0m", shipped)
    wrapped = err.as_instanceof_cause()
    assert cause_line(wrapped) == "ZeroDivisionError: division by zero"


def test_a_worker_error_keeps_its_line_through_pickling():
    err = WorkerError("Traceback ...\nValueError: x", "ValueError: x is not y")
    back = pickle.loads(pickle.dumps(err))
    assert (back.detail, back.cause) == (err.detail, err.cause)
    assert cause_line(back) == "ValueError: x is not y"


def test_the_last_exception_line_of_a_traceback_text_not_a_source_line():
    text = ("Traceback (most recent call last):\n"
            "  File \"/lib/torch/logger.py\", line 90, in wrapper\n"
            "    result = func(*args, **kwargs)\n"
            "             ^^^^^^^^^^^^^^^^^^^^^\n"
            "torch.distributed.checkpoint.api.CheckpointException: CheckpointException "
            "ranks:dict_keys([0])\nmore of the message\n")
    assert traceback_cause(text) == "CheckpointException: CheckpointException ranks:dict_keys([0])"
    assert traceback_cause("no traceback here\nsecond") == "no traceback here"
