"""The commands' log lines: repeated client lines collapse into one per
cause and interval with a count; JSON logs are JSON only, with fields."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import warnings

from dsh_pipeline.log_lines import RepeatedLines, configure_logging
from tests.waiting import wait_for


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record)


def _said(handler: _Kept) -> list[str]:
    return [record.getMessage() for record in handler.lines]


def test_a_client_line_repeated_within_the_interval_is_shown_once_then_counted():
    kept = _Kept()
    repeats = RepeatedLines(kept, interval=0.5)
    kept.addFilter(repeats)
    client, own = logging.getLogger("aiokafka.conn.test"), logging.getLogger("dsh.test")
    for logger in (client, own):
        logger.addHandler(kept)
        logger.propagate = False
    try:
        for node in range(40):
            client.error("Unable connect to node with id %s: %s", node % 2, ConnectionRefusedError("refused"))
        client.error("Heartbeat failed for group %s", "g")  # another cause: shown at once
        own.warning("the service's own line")
        own.warning("the service's own line")  # never collapsed
        assert _said(kept) == ["Unable connect to node with id 0: refused", "Heartbeat failed for group g",
                               "the service's own line", "the service's own line"]
        wait_for(lambda: len(kept.lines) == 5, 10, "the interval's count")
        summary = kept.lines[4]
        assert summary.getMessage().startswith("Unable connect to node with id 1: refused (repeated 39 times in the "
                                               "last ")
        assert (summary.count, summary.reason, summary.name) == (39, "ConnectionRefusedError", "aiokafka.conn.test")
        client.error("Unable connect to node with id %s: %s", 0, ConnectionRefusedError("refused"))
        assert len(kept.lines) == 5  # the cause is still counted: its interval goes on
        repeats.close()  # the command ends: what is counted is said
        assert kept.lines[5].getMessage().startswith("Unable connect to node with id 0: refused (repeated 1 times")
        client.error("Unable connect to node with id %s: %s", 0, ConnectionRefusedError("refused"))
        assert _said(kept)[6] == "Unable connect to node with id 0: refused"  # a new interval starts shown
        wait_for(lambda: not repeats._repeats, 10, "a quiet interval to end the counting")
        client.error("Unable connect to node with id %s: %s", 0, ConnectionRefusedError("refused"))
        assert _said(kept)[7] == "Unable connect to node with id 0: refused"
    finally:
        repeats.close()
        for logger in (client, own):
            logger.removeHandler(kept)
            logger.propagate = True


def test_json_logs_are_json_only_with_fields(capsys):
    # logging captures warnings once per process; pytest gives each test a warnings catcher of its own, so an
    # earlier test's capture would leave this one's warning with pytest: start the capture afresh
    logging.captureWarnings(False)
    configure_logging("INFO", "json", "project")
    try:
        logging.getLogger("dsh.projector").warning(
            "dead-lettered %d record(s)", 2, extra={"topic": "dsh.session-events", "partition": 0, "offset": 0,
                                                    "session": "s-1", "count": 2, "reason": "undecodable"})
        try:
            raise ValueError("bad")
        except ValueError:
            logging.getLogger("dsh.projector").exception("stopped")
        logging.getLogger("aiokafka").info("not shown below WARNING")
        logging.getLogger("aiokafka").error("Unable connect to %s: %s", "node 1", OSError("refused"))
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a library's warning", DeprecationWarning)
        print("a line printed to stderr\nand another", file=sys.stderr)
        lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    finally:
        configure_logging("INFO", "text")
    assert [(line["level"], line["logger"], line["service"]) for line in lines] == [
        ("WARNING", "dsh.projector", "project"), ("ERROR", "dsh.projector", "project"),
        ("ERROR", "aiokafka", "project"), ("WARNING", "py.warnings", "project"), ("WARNING", "stderr", "project"),
        ("WARNING", "stderr", "project")]
    fields = ("message", "topic", "partition", "offset", "session", "count", "reason")
    assert {key: lines[0][key] for key in fields} == {
        "message": "dead-lettered 2 record(s)", "topic": "dsh.session-events", "partition": 0, "offset": 0,
        "session": "s-1", "count": 2, "reason": "undecodable"}
    assert "ValueError: bad" in lines[1]["error"] and lines[0]["time"].endswith("+00:00")
    assert (lines[2]["message"], lines[2]["reason"]) == ("Unable connect to node 1: refused", "OSError")
    assert "a library's warning" in lines[3]["message"]
    assert [line["message"] for line in lines[4:]] == ["a line printed to stderr", "and another"]


def test_a_failing_command_logging_json_says_so_in_json(tmp_path):
    run = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "simulate", "--log-format", "json", "--bootstrap",
                          "127.0.0.1:1", "--wait-for-cluster", "0"], capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in run.stderr.splitlines()]  # every line is JSON
    assert run.returncode == 69, run.stderr
    last = lines[-1]
    assert (last["level"], last["service"], last["reason"]) == ("ERROR", "simulate", "BrokerAbsentError")
    assert last["message"].startswith("dsh-pipeline simulate: BrokerAbsentError: cannot reach the Kafka cluster at "
                                      "127.0.0.1:1")
