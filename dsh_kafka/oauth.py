"""SASL OAUTHBEARER tokens: from a file (a sidecar keeps it fresh) or a command.

The client asks for a token at every login. A file's token is read again
when the file changes; a command's is reused until 30 s before the JWT's
``exp`` (or for five minutes when the token says no expiry), then the
command runs again. A token that cannot be had is a one-line
:class:`PipelineError` naming the file or the command; the token itself is
never logged or shown.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shlex
import time
from dataclasses import dataclass
from typing import Literal

from aiokafka.abc import AbstractTokenProvider

from dsh_core.errors import PipelineError

__all__ = ["TokenProvider", "TokenSource", "token_expiry"]

#: A command's token without an ``exp`` claim is used this long.
UNDATED_SECONDS = 300.0
#: A command's token is renewed this long before it expires.
MARGIN_SECONDS = 30.0
COMMAND_SECONDS = 30.0


@dataclass(frozen=True)
class TokenSource:
    """Where OAUTHBEARER tokens come from: ``file`` (a path) or ``command`` (a command line)."""

    kind: Literal["file", "command"]
    where: str

    def describe(self) -> str:
        return f"the token {'file ' + self.where if self.kind == 'file' else 'command ' + repr(self.where)}"


def token_expiry(token: str) -> float | None:
    """The ``exp`` claim (seconds since the epoch) of a JWT, or ``None``."""
    parts = token.split(".")
    if len(parts) < 2:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, TypeError):
        return None
    exp = payload.get("exp") if isinstance(payload, dict) else None
    return float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None


class TokenProvider(AbstractTokenProvider):
    """aiokafka's token callback over a :class:`TokenSource`."""

    def __init__(self, source: TokenSource) -> None:
        self.source = source
        self._token: str | None = None
        self._valid_until = 0.0  # command: when to run it again
        self._stamp: tuple[int, int] | None = None  # file: (mtime_ns, size) the token was read at
        self._lock = asyncio.Lock()

    async def token(self) -> str:
        async with self._lock:
            if self.source.kind == "file":
                return self._from_file()
            if self._token is None or time.time() >= self._valid_until:
                self._token = await self._from_command()
                expiry = token_expiry(self._token)
                self._valid_until = (expiry - MARGIN_SECONDS) if expiry is not None else time.time() + UNDATED_SECONDS
            return self._token

    def _from_file(self) -> str:
        try:
            status = os.stat(self.source.where)
            stamp = (status.st_mtime_ns, status.st_size)
            if self._token is None or stamp != self._stamp:
                with open(self.source.where, encoding="utf-8") as stream:
                    token = stream.read().strip()
                if not token:
                    raise PipelineError(f"{self.source.describe()} is empty")
                self._token, self._stamp = token, stamp
        except OSError as error:
            raise PipelineError(f"{self.source.describe()}: {error.strerror or error}") from None
        return self._token

    async def _from_command(self) -> str:
        try:
            process = await asyncio.create_subprocess_exec(*shlex.split(self.source.where),
                                                           stdout=asyncio.subprocess.PIPE,
                                                           stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(process.communicate(), COMMAND_SECONDS)
        except asyncio.TimeoutError:
            process.kill()
            raise PipelineError(f"{self.source.describe()} gave no token within {COMMAND_SECONDS:g} s") from None
        except OSError as error:
            raise PipelineError(f"{self.source.describe()} cannot run: {error.strerror or error}") from None
        token = out.decode("utf-8", "replace").strip()
        if process.returncode != 0 or not token:
            said = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
            raise PipelineError(f"{self.source.describe()} exited {process.returncode} without a token: {said[0]}")
        return token
