"""A stream's upstream silence is timed by one timer: it cancels the
relaying task once the upstream it waits on has been silent long enough,
and never counts the time spent sending to a slow client."""

from __future__ import annotations

import asyncio

from producers.gateway import _Silence


def _waiting_task() -> asyncio.Task:
    """A relaying task that waits for ever (made in the running loop)."""
    return asyncio.create_task(asyncio.Event().wait())


def test_an_upstream_silent_past_the_limit_cancels_the_relaying():
    async def scenario() -> tuple[bool, bool]:
        relaying = _waiting_task()
        silence = _Silence(relaying, 0.05)
        done, _ = await asyncio.wait([relaying], timeout=10)
        silence.cancel()
        return bool(done) and relaying.cancelled(), silence.expired

    assert asyncio.run(scenario()) == (True, True)


def test_time_spent_sending_to_the_client_is_no_silence():
    async def scenario() -> tuple[bool, int]:
        relaying = _waiting_task()
        silence = _Silence(relaying, 30)
        silence.since = None  # a chunk is being sent
        silence._check()  # as if the timer fired: moved on, not expired
        expired, cancelling = silence.expired, relaying.cancelling()
        silence.cancel()
        relaying.cancel()
        return expired, cancelling

    assert asyncio.run(scenario()) == (False, 0)


def test_a_silence_shorter_than_the_limit_moves_the_timer_on():
    async def scenario() -> tuple[bool, bool]:
        relaying = _waiting_task()
        silence = _Silence(relaying, 30)
        silence._check()  # fired early (a chunk came since it was armed): not expired
        early = silence.expired
        silence.since = silence.loop.time() - 31  # the upstream has been silent past the limit
        silence._check()
        late = silence.expired
        silence.cancel()
        await asyncio.wait([relaying], timeout=10)
        return early, late and relaying.cancelled()

    assert asyncio.run(scenario()) == (False, True)
