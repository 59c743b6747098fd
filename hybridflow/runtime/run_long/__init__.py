"""What outlives a step: the run-long scheduler and the state it owns.

State, and the one module that changes each:
- what was drawn from the prompt loader and not consumed — the one checkpoint state
  (`draws.Draws`);
- the buffer: a ledger of whole units (groups or batches) with their numbers, never
  their rows, and the one admission rule (`stream_buffer.GroupBuffer`, `admits`);
- where samples come from: a node's output made inside the passes (`pass_source`)
  or a rollout stream whose samples wait on the rollout workers (`stream_source`,
  driven through `stream_client`, screened by `stream_entrance`, recorded for the
  timeline by `stream_record`).

`run_scheduler.RunScheduler` runs one step loop over them for every mode; the step
itself (one pass) is `runtime/scheduler.py`'s. The run loop (`hybridflow/run/loop.py`)
owns one RunScheduler; workers never see any of this state.
"""
from hybridflow.runtime.run_long.run_scheduler import RunScheduler, make_run_scheduler

__all__ = ["RunScheduler", "make_run_scheduler"]
