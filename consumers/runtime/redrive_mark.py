"""The mark ``dead-letters --redrive`` puts on a record it sends back, and
how a service decides to believe it.

A redriven record carries where it was first read and the reasons it was
refused there (``dsh-redrive-*``). A service that refuses it again for one
of those reasons writes no new letter: the old one stands, so a redrive run
from cron does not multiply letters. That suppression is only safe for a
mark the redrive path made: any producer of the events topic can add
headers, and a forged mark on a bad record would otherwise hide it (no
letter anywhere). So the mark is signed: ``dsh-redrive-mac`` is an
HMAC-SHA256, under the deployment's redrive key, of the mark and of the
record as sent (key, value, every other header in order). A service
believes a mark only when the MAC verifies under its own key; a mark it
cannot verify (no key, another key, a changed byte) is no mark at all: the
record is dead-lettered like any other, under its own coordinates.

The key is a secret shared by ``dead-letters --redrive`` and the three
services, read from the 0600 file ``DSH_REDRIVE_KEY_FILE`` names.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Iterable, Sequence

from dsh_kafka.config import Secret

__all__ = ["REDRIVE_KEY_ENV", "MIN_KEY_CHARACTERS", "Source", "redrive_headers", "redriven_from"]

#: The environment variable naming the redrive key's file.
REDRIVE_KEY_ENV = "DSH_REDRIVE_KEY_FILE"
#: A shorter key is refused where it is read (a guessable key forges marks).
MIN_KEY_CHARACTERS = 32

_PREFIX = "dsh-redrive-"
_SOURCE = ("dsh-redrive-topic", "dsh-redrive-partition", "dsh-redrive-offset")
_REASONS = "dsh-redrive-reasons"
_MAC = "dsh-redrive-mac"
#: ``(topic, partition, offset)`` where a record was first read.
Source = tuple[str, int, int]
Headers = Sequence[tuple[str, bytes | None]]


def redrive_headers(key: Secret, record_key: bytes | None, value: bytes | None, headers: Headers, source: Source,
                    reasons: Iterable[str]) -> list[tuple[str, bytes | None]]:
    """``headers`` (the record's own, without any ``dsh-redrive-*``) followed
    by the signed mark saying where the record was first read and why it was
    refused."""
    own = [(name, value_) for name, value_ in headers if not name.startswith(_PREFIX)]
    mark = [*((name, str(part).encode()) for name, part in zip(_SOURCE, source)),
            (_REASONS, ",".join(sorted(set(reasons))).encode())]
    return [*own, *mark, (_MAC, _mac(key, record_key, value, own, mark).encode())]


def redriven_from(key: Secret | None, record_key: bytes | None, value: bytes | None,
                  headers: Headers) -> tuple[Source, frozenset[str]] | None:
    """Where a redriven record was first read and why it was refused there,
    when its mark verifies under ``key``; ``None`` for a record without a
    mark, with a mark that does not verify, or when there is no key."""
    own = [(name, item) for name, item in headers if not name.startswith(_PREFIX)]
    given = {name: item for name, item in headers if name.startswith(_PREFIX)}
    if key is None or not isinstance(mac := given.get(_MAC), bytes):
        return None
    mark = [(name, given.get(name)) for name in (*_SOURCE, _REASONS)]
    if not hmac.compare_digest(mac, _mac(key, record_key, value, own, mark).encode()):
        return None
    try:
        topic, partition, offset, reasons = (item.decode() if item is not None else "" for _, item in mark)
    except UnicodeDecodeError:
        return None
    if not (topic and partition.isdigit() and offset.isdigit() and reasons):
        return None
    return (topic, int(partition), int(offset)), frozenset(reasons.split(","))


def _mac(key: Secret, record_key: bytes | None, value: bytes | None, headers: Headers, mark: Headers) -> str:
    """HMAC-SHA256 of every field, each length-prefixed (null apart from
    empty), so no two different records share an input."""
    signed = hmac.new(key.reveal().encode(), digestmod=hashlib.sha256)
    for part in (record_key, value, *(item for pair in (*headers, *mark) for item in (pair[0].encode(), pair[1]))):
        signed.update(b"\xff" * 8 if part is None else len(part).to_bytes(8, "big") + part)
    return signed.hexdigest()
