"""The long-running commands' log lines on stderr.

* ``text``: ``time level logger: message``; ``json``: one JSON object per
  line (:class:`JsonLogFormatter`) and nothing else, so a log shipper never
  meets a plain line: warnings go through logging, and whatever is written
  to ``sys.stderr`` directly leaves as a line of logger ``stderr``.
* A line may carry fields, given as ``extra=``: :data:`FIELDS`.
* The Kafka client's lines start at WARNING, and its repeats collapse
  (:class:`RepeatedLines`): a broker outage gives one line per cause and
  :data:`REPEAT_INTERVAL`, with a count, not one per retry.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TextIO

__all__ = ["CLIENT_LOGGERS", "FIELDS", "REPEAT_INTERVAL", "JsonLogFormatter", "RepeatedLines", "configure_logging",
           "log_error"]

#: What a line may say besides its message (``extra=``): the command or
#: service, the Kafka coordinates (a record's partition and offset, or the
#: numbers of the partitions a line is about), the session, how many, why.
FIELDS = ("service", "topic", "partition", "offset", "partitions", "session", "count", "reason")
#: The loggers of the Kafka client, whose repeated lines are collapsed.
CLIENT_LOGGERS = ("aiokafka",)
#: Seconds over which one client line's repeats are counted into one line.
REPEAT_INTERVAL = 60.0

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``,
    ``logger``, ``service`` (the line's, else the command's), ``message``,
    the :data:`FIELDS` the line carries, ``reason`` (else the class of an
    exception among the message's arguments) and, for an exception,
    ``error`` (its traceback)."""

    def __init__(self, service: str | None = None) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
                "level": record.levelname, "logger": record.name, "service": self.service,
                "message": record.getMessage()}
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:  # 0 is a partition, an offset, a count
                line[name] = value
        line["reason"] = line.get("reason") or _error_class(record)
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps({key: value for key, value in line.items() if value is not None}, ensure_ascii=False,
                          default=str)


def _error_class(record: logging.LogRecord) -> str | None:
    """The class of an exception among a line's arguments (the Kafka
    client's lines name their cause so)."""
    args = record.args if isinstance(record.args, tuple) else ()
    return next((type(arg).__name__ for arg in args if isinstance(arg, BaseException)), None)


@dataclass
class _Repeats:
    """One client line's repeats in the current interval."""

    started: float
    timer: threading.Timer
    count: int = 0
    last: logging.LogRecord | None = None


class RepeatedLines(logging.Filter):
    """A handler's filter collapsing repeated lines of the client loggers.

    A line is repeated when its logger, level and message template (its
    text before the arguments are filled in) are those of a line already
    shown less than ``interval`` seconds ago. The first shows; its repeats
    are counted, and when the interval ends one line shows the last of
    them, ``… (repeated N times in the last S s)`` (field ``count``); an
    interval without repeats ends it, so the next such line shows at once.
    :meth:`close` shows what is still counted. Other loggers' lines pass.
    """

    def __init__(self, handler: logging.Handler, loggers: tuple[str, ...] = CLIENT_LOGGERS,
                 interval: float = REPEAT_INTERVAL) -> None:
        super().__init__()
        self.handler = handler
        self.loggers = loggers
        self.interval = interval
        self._lock = threading.Lock()
        self._repeats: dict[tuple[str, int, str], _Repeats] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "count", None) is not None or not self._collapses(record.name):
            return True
        key = (record.name, record.levelno, str(record.msg))
        with self._lock:
            repeats = self._repeats.get(key)
            if repeats is None:
                self._repeats[key] = _Repeats(time.monotonic(), self._timer(key))
                return True
            repeats.count += 1
            repeats.last = record
            return False

    def close(self) -> None:
        """Show every count not shown yet (the command is ending)."""
        with self._lock:
            repeats, self._repeats = self._repeats, {}
        for pending in repeats.values():
            pending.timer.cancel()
            self._show(pending)

    def _collapses(self, name: str) -> bool:
        return any(name == logger or name.startswith(f"{logger}.") for logger in self.loggers)

    def _timer(self, key: tuple[str, int, str]) -> threading.Timer:
        timer = threading.Timer(self.interval, self._interval_ended, (key,))
        timer.daemon = True
        timer.start()
        return timer

    def _interval_ended(self, key: tuple[str, int, str]) -> None:
        with self._lock:
            repeats = self._repeats.pop(key, None)
            if repeats is None or repeats.count == 0:
                return  # closed, or quiet for a whole interval: the next such line shows at once
            self._repeats[key] = _Repeats(time.monotonic(), self._timer(key))
        self._show(repeats)

    def _show(self, repeats: _Repeats) -> None:
        if repeats.last is None:
            return
        last = repeats.last
        summary = logging.LogRecord(last.name, last.levelno, last.pathname, last.lineno,
                                    f"{last.getMessage()} (repeated {repeats.count} times in the last "
                                    f"{time.monotonic() - repeats.started:.0f} s)", None, None, last.funcName)
        summary.count = repeats.count
        summary.reason = getattr(last, "reason", None) or _error_class(last)
        self.handler.handle(summary)


class _StderrHandler(logging.StreamHandler):
    """The commands' one handler; closing it shows the repeats still counted."""

    def __init__(self, stream: TextIO, formatter: logging.Formatter) -> None:
        super().__init__(stream)
        self.setFormatter(formatter)
        self.repeats = RepeatedLines(self)
        self.addFilter(self.repeats)

    def close(self) -> None:
        self.repeats.close()
        super().close()


class _LoggedStderr(io.TextIOBase):
    """``sys.stderr`` under JSON logs: each line written to it directly (a
    ``print``, a library's own output) leaves as a WARNING of logger
    ``stderr``, so the stream stays JSON only."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw
        self._partial = ""
        self._writing = threading.local()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if getattr(self._writing, "active", False):  # logging's own complaint about a failed line
            return self.raw.write(text)
        self._writing.active = True
        try:
            *lines, self._partial = (self._partial + text).split("\n")
            for line in filter(None, lines):
                logging.getLogger("stderr").warning("%s", line)
        finally:
            self._writing.active = False
        return len(text)

    def flush(self) -> None:
        self.raw.flush()


def configure_logging(level: str, log_format: str, service: str | None = None) -> None:
    """The command's log lines on stderr at ``level`` (the Kafka client's:
    WARNING and up), as ``text`` or ``json`` (every line; ``service`` is its
    field, the command's name)."""
    raw = sys.stderr.raw if isinstance(sys.stderr, _LoggedStderr) else sys.stderr
    formatter = (JsonLogFormatter(service) if log_format == "json" else logging.Formatter(_TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[_StderrHandler(raw, formatter)], force=True)
    logging.captureWarnings(True)
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, logging.getLevelName(level)))
    sys.stderr = _LoggedStderr(raw) if log_format == "json" else raw


def log_error(command: str, message: str, error: BaseException, traceback: bool = False) -> None:
    """A command's last word, ``dsh-pipeline COMMAND: MESSAGE``: one JSON
    line (``reason``: the error's class; ``error``: the traceback) where
    the command logs JSON, else plain text on stderr; after the counts of
    repeated lines not shown yet."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, _StderrHandler):
            handler.repeats.close()
    if isinstance(sys.stderr, _LoggedStderr):
        logging.getLogger("dsh_pipeline").error("dsh-pipeline %s: %s", command, message,
                                                extra={"reason": type(error).__name__},
                                                exc_info=error if traceback else None)
        return
    if traceback:
        import traceback as tracebacks
        tracebacks.print_exception(error)
    print(f"dsh-pipeline {command}: {message}", file=sys.stderr)
