"""An environment call and the work around it, bounded as one: `bounded_call(fn, arg,
after, timeout_s)` runs `fn(arg)` and then `after(value)` (checking the result,
tokenizing the observation) in a daemon thread — or awaits `fn` when it is `async`,
then runs `after` in a daemon thread — and waits at most `timeout_s` seconds for both.

Why a daemon thread per call and not a thread pool: a Python thread cannot be
stopped, and a pool's threads are joined when the interpreter exits, so one
environment that never returns kept the process alive after its run had failed
(issue 26). A daemon thread is left behind instead. Why `after` inside the bound: a
5 MB observation took minutes to tokenize on the event loop, outside any timeout.

Whatever the user's code raises is contained: an Exception comes back as it is, and
a `SystemExit` or `KeyboardInterrupt` (or any other BaseException) as a
`UserCodeExit` naming it, so it ends this episode, not the event loop (which used to
print ~1,500 lines of "Task exception was never retrieved") nor the run as a Ctrl-C.
`max_token_chars(fmt)` bounds an observation's length before it is tokenized at all.
State: `_LONGEST`, each tokenizer's longest token, measured once.
"""
from __future__ import annotations

import asyncio
import inspect
import threading
from typing import Any, Callable

from hybridflow.core.origin import contain

__all__ = ["bounded_call", "max_token_chars"]


def _deliver(future: asyncio.Future, value: Any, err: BaseException | None) -> None:
    if future.done():  # timed out and cancelled meanwhile
        return
    if err is None:
        future.set_result(value)
    else:
        future.set_exception(err)


def _in_daemon_thread(loop, work: Callable[[], Any], name: str) -> asyncio.Future:
    future = loop.create_future()

    def target():
        try:
            value, err = work(), None
        except BaseException as raised:  # noqa: BLE001 - contained, delivered to the loop
            value, err = None, contain(raised, name)
        try:
            loop.call_soon_threadsafe(_deliver, future, value, err)
        except RuntimeError:  # the loop has closed: the episode ended long ago
            pass

    threading.Thread(target=target, name=f"agent-env {name}", daemon=True).start()
    return future


async def _call(fn, arg, after, name: str):
    loop = asyncio.get_running_loop()
    if inspect.iscoroutinefunction(fn):
        try:
            value = await fn(arg)
        except asyncio.CancelledError:
            raise
        except BaseException as raised:  # noqa: BLE001 - the user's coroutine: contained
            raise contain(raised, name) from None
        return await _in_daemon_thread(loop, lambda: after(value), name)
    return await _in_daemon_thread(loop, lambda: after(fn(arg)), name)


async def bounded_call(fn, arg, after: Callable[[Any], Any], timeout_s: float, name: str):
    """`after(fn(arg))` within `timeout_s` (asyncio.TimeoutError past it); what the
    user's code raises is contained (see the module docstring)."""
    return await asyncio.wait_for(_call(fn, arg, after, name), timeout_s)


_LONGEST: dict[int, int] = {}  # id(tokenizer) -> its longest token's text length


def _longest_token(tokenizer) -> int:
    if id(tokenizer) not in _LONGEST:
        try:
            tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
            _LONGEST[id(tokenizer)] = max((len(t) for t in tokens if isinstance(t, str)),
                                          default=16)
        except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary listing
            _LONGEST[id(tokenizer)] = 64
    return _LONGEST[id(tokenizer)]


def max_token_chars(fmt) -> int:
    """An upper bound on the characters one token covers, for `fmt`'s tokenizer (twice
    its longest token's text, for normalisation): an observation longer than
    `tokens_left * max_token_chars` cannot fit and is not tokenized at all."""
    tokenizer = getattr(fmt, "tokenizer", None)
    return 2 * _longest_token(tokenizer) if tokenizer is not None else 1 << 20
