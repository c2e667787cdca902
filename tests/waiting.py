"""Waiting on a condition with a deadline (never a fixed sleep)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable


def wait_for(condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        threading.Event().wait(poll)  # wait-ok: polling a condition with a deadline


async def until(condition: Callable[[], bool], timeout: float, what: str, poll: float = 0.1) -> None:
    """:func:`wait_for` inside an event loop (the services go on meanwhile)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(poll)  # wait-ok: polling a condition with a deadline
