"""What leaves a worker method: a WorkerError with the traceback and the one line of
its root cause, for any exception (a library's BaseException too), except a signal's."""
import errno

import pytest

from hybridflow.run.signals import Interrupted
from hybridflow.runtime.worker_errors import WorkerError, shipped


def _dcp_full_disk():
    from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception
    try:
        raise OSError(errno.ENOSPC, "No space left on device", "/r/actor/dcp/__0_0.distcp")
    except OSError as err:
        raise CheckpointException("save", {0: _wrap_exception(err)}) from None


def test_a_library_base_exception_leaves_as_a_worker_error_with_its_cause():
    with pytest.raises(WorkerError) as caught:
        with shipped():
            _dcp_full_disk()
    assert caught.value.cause == ("OSError: No space left on device: "
                                  "/r/actor/dcp/__0_0.distcp")
    assert "Traceback" in caught.value.detail


def test_sys_exit_from_user_code_is_contained_and_said():
    with pytest.raises(WorkerError) as caught:
        with shipped():
            raise SystemExit(3)
    assert "called sys.exit(3)" in caught.value.cause


def test_a_signal_passes_through():
    with pytest.raises(Interrupted):
        with shipped():
            raise Interrupted(15)
