"""Request reconstruction (docs/formats/v0.md §6.2) and the request digest.

A model request is a pure function of a log prefix. :class:`BoundaryTracker`
finds, event by event, where each request attempt's prefix ends: the first
``assistant/chunk`` of a ``(turn, step)``, the first chunk after a ``finish``
(a retry), or an ``assistant/message`` of a step that logged no chunk.
:func:`build_request` assembles the request from the folded header and the
derived messages of that prefix, and :func:`request_digest` is the
attestation digest: SHA-256 of its RFC 8785 (JCS) canonical JSON.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple, Sequence

from .jsonvalue import canonical_json, sha256_jcs

__all__ = ["Boundary", "BoundaryTracker", "build_request", "request_digest", "request_frame", "MessagesDigest",
           "DIGEST_ALGORITHM"]

DIGEST_ALGORITHM = "sha256-jcs"


class Boundary(NamedTuple):
    """Where one request attempt starts: the seq of its first response event."""

    turn: Any
    step: Any
    attempt: int
    seq: int


def _key(turn: Any, step: Any) -> Any:
    if type(turn) is int and type(step) is int:
        return (turn, step)
    return canonical_json([turn, step])  # anything else: key by its JSON


class BoundaryTracker:
    """Detects request boundaries; call :meth:`observe` *before* the event at
    ``seq`` is folded, so the current fold is exactly the request's prefix.
    In v3/v4 logs every ``assistant/attempt`` and ``assistant/message`` is
    one (their streams are inside them)."""

    __slots__ = ("_steps",)

    def __init__(self) -> None:
        # (turn, step) -> [attempts so far, next chunk opens a new attempt]
        self._steps: dict[Any, list[Any]] = {}

    def observe(self, event_type: str, seq: int, data: Any) -> Boundary | None:
        if event_type == "assistant/chunk":
            turn, step = data.get("turn"), data.get("step")
            state = self._steps.setdefault(_key(turn, step), [0, True])
            boundary = None
            if state[1]:
                state[0] += 1
                state[1] = False
                boundary = Boundary(turn, step, state[0], seq)
            chunk = data.get("chunk")
            if isinstance(chunk, dict) and chunk.get("type") == "finish":
                state[1] = True
            return boundary
        if event_type == "assistant/attempt" and isinstance(data, dict):  # v3/v4: a failed attempt
            turn, step = data.get("turn"), data.get("step")
            state = self._steps.setdefault(_key(turn, step), [0, None])
            state[0] += 1
            return Boundary(turn, step, state[0], seq)
        if event_type == "assistant/message" and isinstance(data, dict):
            turn, step = data.get("turn"), data.get("step")
            key = _key(turn, step)
            if key not in self._steps:
                self._steps[key] = [1, True]
                return Boundary(turn, step, 1, seq)
            state = self._steps[key]
            if state[1] is None:  # after failed attempts (v3/v4: the stream is inside the message)
                state[0] += 1
                state[1] = True
                return Boundary(turn, step, state[0], seq)
        return None

    def observe_delta_run(self, turn: Any, step: Any, seq0: int) -> Boundary | None:
        """A packed row: delta chunks only, so at most its first member opens
        an attempt."""
        return self.observe("assistant/chunk", seq0, {"turn": turn, "step": step})

    def to_json(self) -> list[Any]:
        """The tracker's state as a JSON value (for :meth:`from_json`)."""
        return [[list(key) if isinstance(key, tuple) else key.decode(), list(value)]
                for key, value in self._steps.items()]

    @classmethod
    def from_json(cls, saved: list[Any]) -> "BoundaryTracker":
        tracker = cls()
        tracker._steps = {(tuple(key) if isinstance(key, list) else key.encode()): list(value) for key, value in saved}
        return tracker


def build_request(header: Any, messages: list[Any], session_id: str) -> dict[str, Any]:
    """The request a loop sends from a prefix (docs/formats/v0.md §6.2)::

        {**header.config, "messages": [...], "system"?: str, "tools"?: [...],
         "sessionId": id}

    ``adapterDefaults`` is not a request field.
    """
    request: dict[str, Any] = dict(header["config"])
    request["messages"] = messages
    if "system" in header:
        request["system"] = header["system"]
    if "tools" in header:
        request["tools"] = header["tools"]
    request["sessionId"] = session_id
    return request


def request_digest(request: dict[str, Any]) -> str:
    """Hex SHA-256 of the JCS canonical JSON of a request (``sha256-jcs``)."""
    return sha256_jcs(request)


def _utf16(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def request_frame(header: Any, session_id: str) -> tuple[bytes, bytes]:
    """The JCS text of a request around its messages array: everything up to
    and including ``"messages":[`` and everything from the closing ``]``.
    With :class:`MessagesDigest` it gives :func:`request_digest` of
    :func:`build_request` without encoding the messages again each time."""
    fields = build_request(header, [], session_id)
    del fields["messages"]
    keys = sorted(fields, key=_utf16)
    before = [key for key in keys if _utf16(key) < _utf16("messages")]
    members = {key: canonical_json(key) + b":" + canonical_json(fields[key]) for key in keys}
    prefix = b"{" + b"".join(members[key] + b"," for key in before) + b'"messages":['
    suffix = b"]" + b"".join(b"," + members[key] for key in keys[len(before):]) + b"}"
    return prefix, suffix


class MessagesDigest:
    """Hex SHA-256 of ``prefix``, the JCS array elements of a derived history,
    and ``suffix``, kept incrementally: derived messages only grow within a
    replace generation, so each is encoded once; a new generation or prefix
    starts over. With the default frame it is ``sha256_jcs(messages)``."""

    __slots__ = ("_hasher", "_count", "_key")

    def __init__(self) -> None:
        self._hasher = hashlib.sha256()
        self._count = 0
        self._key: tuple[int, bytes] | None = None

    def of(self, messages: Sequence[Any], generation: int, prefix: bytes = b"[", suffix: bytes = b"]") -> str:
        if (generation, prefix) != self._key:
            self._hasher, self._count, self._key = hashlib.sha256(prefix), 0, (generation, prefix)
        hasher = self._hasher
        for message in messages[self._count:]:
            if self._count:
                hasher.update(b",")
            hasher.update(canonical_json(message))
            self._count += 1
        final = hasher.copy()
        final.update(suffix)
        return final.hexdigest()
