"""Differential tests: our v4 reader against dsh 0.2.1rc2's own reader.

dsh's JavaScript, cut unmodified out of the published runtime wheel, runs
under Node 22 (``tests/oracle``). Every seed log — hand-built ones, the
real logs the 0.2.1rc2 runtime wrote (``tests/fixtures/dsh-0.2.1``) and
random ones (``tests/oracle/random_logs.py``) — is written with single
mutations of ``tests/oracle/mutations.py`` into one
sessions root; dsh reads the root once and each session's verdict, category,
event count, surface, derived messages, request header and context must be
ours. Skipped, saying why, only where Node 22 cannot be installed.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from dsh_core.inspect import inspect_path
from dsh_core.loader import read_events
from dsh_core.migration.migrate import migrated_log, v4_file
from tests.conftest import canonical
from tests.differential.test_v0_migration import dsh_lines, event_lines
from tests.oracle import encode_segment, place_log, run_oracle
from tests.oracle.image_logs import IMAGE_MUTATIONS, image, image_log
from tests.oracle.mutations import MUTATIONS, Log, plain_log, read_log, tools_log, write_mutations
from tests.oracle.random_logs import random_log

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dsh-0.2.1"
REAL_LOGS = sorted(FIXTURES.glob("*.v4.jsonl.zstd"))

#: dsh reports a log in another session's folder with a plain Error; ours names it an identity problem.
_CATEGORY_OF_PLAIN_ERROR = {"identity": "invalid-log"}


#: Random logs, each written with a random third of the mutations.
RANDOM_LOGS = 40


def _seeds() -> list[tuple[object, list[str] | None]]:
    rng = random.Random(2026)
    drawn = [(random_log(rng, f"session-random-{number}"), ["control", *rng.sample(sorted(MUTATIONS), len(MUTATIONS) // 3)])
             for number in range(RANDOM_LOGS)]
    return [(plain_log(), None), (tools_log(), None), *((read_log(log), None) for log in REAL_LOGS), *drawn]


@pytest.fixture(scope="module")
def readings(oracle: Path, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, dict, dict]]:
    """``(session id, our inspect JSON, dsh's reading)`` of every written session."""
    root = tmp_path_factory.mktemp("sessions")
    folders = {}
    for seed, names in _seeds():
        for session_id in write_mutations(seed, root, names).values():
            folders[encode_segment(session_id)] = session_id
    theirs = run_oracle(root)
    return [(folders[path.parent.name], _ours(path), theirs[folders[path.parent.name]])
            for path in sorted(root.glob("*/*/session.v4.jsonl.zstd"))]


def _ours(path: Path) -> dict:
    return inspect_path(path).to_json()


def test_every_mutation_of_every_seed_was_read_by_both(readings):
    assert len(readings) >= 2 * len(MUTATIONS) - 20  # a few mutations do not apply to a seed
    assert len(REAL_LOGS) >= 8, f"the real 0.2.1rc2 logs are missing from {FIXTURES}"


def test_verdicts_and_categories_agree(readings):
    disagreements = []
    for session_id, ours, theirs in readings:
        if ours["accepted"] != theirs["ok"]:
            disagreements.append((session_id, ours["error"], theirs.get("message")))
        elif not ours["accepted"]:
            category = _CATEGORY_OF_PLAIN_ERROR.get(ours["error"]["category"], ours["error"]["category"])
            if category != theirs["category"]:
                disagreements.append((session_id, ours["error"], theirs.get("message")))
    assert disagreements == []


def test_accepted_logs_derive_what_dsh_derives(readings):
    compared = 0
    for session_id, ours, theirs in readings:
        if not theirs["ok"]:
            continue
        assert ours["eventCount"] == len(theirs["events"]), session_id
        assert ours["surfaceNodes"] == theirs["surface"]["nodes"], session_id
        assert ours["replaceGeneration"] == len(theirs["surface"]["replacements"]), session_id
        for mine, key in (("derivedMessages", "messages"), ("requestHeader", "requestHeader"),
                          ("requestContext", "requestContext")):
            assert canonical(ours[mine]) == canonical(theirs.get(key)), (session_id, mine)
        compared += 1
    assert compared >= 20


def test_the_random_logs_are_sessions_dsh_accepts(readings):
    controls = [theirs for session_id, _, theirs in readings
                if session_id.startswith("session-random-") and session_id.endswith("--control")]
    assert len(controls) == RANDOM_LOGS
    assert all(theirs["ok"] for theirs in controls), [theirs.get("message") for theirs in controls if not theirs["ok"]]


V3_LOGS = sorted((FIXTURES.parent / "dsh-0.1.5").glob("*.v3.jsonl.zstd"))
#: Left out for v3: dsh migrates a v3 log only after reading its whole
#: project folder, where one file with another version or id fails every
#: session beside it; the v4 cases above check those rules. The v0 tool
#: result shape is what a v3 log already holds.
_NOT_FOR_V3 = {"header_version_0", "header_version_3", "header_version_5", "header_wrong_id", "v0_tool_result_shape"}


def test_v3_logs_and_their_mutations_read_as_dsh_migrates_them(oracle, tmp_path):
    names = sorted(name for name in MUTATIONS if name not in _NOT_FOR_V3)
    rng = random.Random(15)  # half the mutations per log: dsh reads a v3 log's whole folder to migrate it
    theirs: dict[str, dict] = {}
    for log in V3_LOGS:  # each log's project folder in a sessions root of its own: dsh's reading of a root
        root = tmp_path / log.name.removesuffix(".v3.jsonl.zstd")  # costs more with each folder beside
        write_mutations(read_log(log), root, ["control", *rng.sample(names, len(names) // 2)],
                        file_name="session.v3.jsonl.zstd")
        theirs |= run_oracle(root)
    paths = sorted(tmp_path.glob("*/*/*/session.v3.jsonl.zstd"))
    assert len(V3_LOGS) >= 8 and len(paths) >= len(V3_LOGS) * (len(names) // 2 - 5)
    disagreements = []
    for path in paths:
        ours, reading = _ours(path), theirs[path.parent.name]
        if ours["accepted"] != reading["ok"]:
            disagreements.append((path.parent.name, ours["error"], reading.get("message")))
        elif not reading["ok"]:
            if ours["error"]["category"] != reading["category"]:
                disagreements.append((path.parent.name, ours["error"], reading["message"]))
        elif (ours["eventCount"], ours["surfaceNodes"], canonical(ours["derivedMessages"])) != (
                len(reading["events"]), reading["surface"]["nodes"], canonical(reading["messages"])):
            disagreements.append((path.parent.name, "derived", None))
        elif event_lines(v4_file(migrated_log(path))) != dsh_lines(reading["events"]):
            disagreements.append((path.parent.name, "migrated file", None))
    assert disagreements == []


def test_v0_logs_of_dsh_0_1_2_are_read_by_both(oracle, tmp_path):
    """dsh 0.2.1 reads v0 only through its migration chain (its messages are
    the migrated ones), so here the verdict is what is compared; what 0.1.2
    itself derives is checked in ``tests/unit/dsh_core/storage/test_dsh_012.py``."""
    logs = sorted((FIXTURES.parent / "dsh-0.1.2").glob("*.jsonl.zstd"))
    ids = {place_log(log, tmp_path): log for log in logs}
    theirs = run_oracle(tmp_path)
    assert len(ids) == len(logs) >= 7
    for session_id, log in ids.items():
        assert theirs[session_id]["ok"], theirs[session_id]
        assert _ours(log)["accepted"], log.name


#: Random logs with images, each written with three random image mutations.
IMAGE_RANDOM_LOGS = 40


def _disagreement(ours: dict, theirs: dict, events: list | None) -> object:
    """What differs between our reading and dsh's (``None``: nothing):
    verdict, category, events (``events``: ours as stored, when comparable),
    surface and derived messages."""
    if ours["accepted"] != theirs["ok"]:
        return ("verdict", ours["error"], theirs.get("message"))
    if not theirs["ok"]:
        category = _CATEGORY_OF_PLAIN_ERROR.get(ours["error"]["category"], ours["error"]["category"])
        return None if category == theirs["category"] else ("category", ours["error"], theirs["message"])
    mine = (ours["eventCount"], ours["surfaceNodes"], ours["replaceGeneration"], canonical(ours["derivedMessages"]),
            canonical(ours["requestHeader"]), canonical(ours["requestContext"]))
    dsh = (len(theirs["events"]), theirs["surface"]["nodes"], len(theirs["surface"]["replacements"]),
           canonical(theirs["messages"]), canonical(theirs["requestHeader"]), canonical(theirs["requestContext"]))
    if mine != dsh:
        return ("derived", [index for index, (a, b) in enumerate(zip(mine, dsh)) if a != b])
    if events is not None and canonical(events[:ours["eventCount"]]) != canonical(theirs["events"]):
        return ("events",)
    return None


def test_image_offloads_read_as_dsh_reads_them(oracle, tmp_path):
    """Hand-built and random logs whose images dsh offloaded, and each rule
    of dsh's image/offload projection broken once: the same verdict,
    category, events, surface and derived messages."""
    rng = random.Random(8086)
    hand = write_mutations(image_log(), tmp_path, table=IMAGE_MUTATIONS)
    drawn = []
    for number in range(IMAGE_RANDOM_LOGS):
        log = random_log(rng, f"session-images-{number}", images=True)
        drawn.append(sum(event["type"] == "image/offload" for event in log.events()))
        write_mutations(log, tmp_path, ["control", *rng.sample(sorted(IMAGE_MUTATIONS), 3)], table=IMAGE_MUTATIONS)
    theirs = run_oracle(tmp_path)
    paths = sorted(tmp_path.glob("*/*/session.v4.jsonl.zstd"))
    disagreements = []
    for path in paths:
        reading = theirs[path.parent.name]
        problem = _disagreement(_ours(path), reading, read_events(path)[1])
        if problem is not None:
            disagreements.append((path.parent.name, problem))
    assert disagreements == []
    assert set(hand) == set(IMAGE_MUTATIONS), set(IMAGE_MUTATIONS) - set(hand)
    refused = {name for name, session_id in hand.items() if not theirs[session_id]["ok"]}
    assert refused == {name for name in IMAGE_MUTATIONS if name != "control" and not name.startswith("valid_")}
    offloaded = [reading for reading in theirs.values() if reading["ok"] and any(
        block.get("offloaded") is True for message in reading["messages"] for block in message["content"])]
    assert sum(count > 0 for count in drawn) >= IMAGE_RANDOM_LOGS // 2 and len(offloaded) >= IMAGE_RANDOM_LOGS // 2
    assert len(paths) >= len(IMAGE_MUTATIONS) + IMAGE_RANDOM_LOGS


def _restarted_with_images(log: Log) -> Log:
    """A v3 log whose last turn a restart reopened (dsh's migration inserts an
    interrupted turn/end there, so every later seq moves by one), with images
    in a tool result and in the new turn's user message, and an offload of
    both after the move."""
    events = log.events()
    end = next(index for index, event in enumerate(events) if event["type"] == "turn/end")
    kept = events[:end]
    result = next(event for event in kept if event["type"] == "tool/result")
    result["data"]["message"]["content"][0]["content"].append(image("shot.png"))
    answer = next(event for event in reversed(kept) if event["type"] == "assistant/message")
    header = next(event for event in kept if event["type"] == "request/header")
    context = next(event for event in kept if event["type"] == "request/context")
    user = {"id": "user-restart", "role": "user", "source": {"kind": "user"},
            "content": [{"type": "text", "text": "and these?"}, image("a.png"), image("b.png")]}
    time = kept[-1]["time"]
    added = [("agent/inbox/spliced", {"target": "next-turn", "start": 0, "inserted": [user]}, {}),
             ("turn/start", {"turn": 2}, {}),
             ("step/start", {"turn": 2, "step": 1}, {}),
             ("user/message", user, {"surfaceOp": "append"}),
             ("request/header", {**header["data"], "reason": "resume"}, {}),
             ("request/context", context["data"], {}),
             ("image/offload", {"targets": [{"seq": result["seq"], "imageIndexes": [0]},
                                            {"seq": len(kept) + 3, "imageIndexes": [1]}]}, {}),
             ("assistant/message", {**answer["data"], "turn": 2, "step": 1}, {"surfaceOp": "append"}),
             ("step/end", {"turn": 2, "step": 1}, {}),
             ("turn/end", {"turn": 2, "reason": {"kind": "completed"}}, {})]
    for kind, data, envelope in added:
        kept.append({"type": kind, "seq": len(kept), "time": time, "data": data, **envelope})
    return Log((log.frames[0], tuple(json.dumps(event, separators=(",", ":"), ensure_ascii=False) for event in kept)))


#: Image mutations for the v3 log: the remap of the moved offload, then the projection.
_V3_IMAGE_MUTATIONS = ["control", "valid_offload_all_remaining", "data_not_object", "targets_not_array",
                       "target_not_object", "target_no_seq", "target_seq_string", "target_later_event",
                       "index_missing", "offload_again", "target_system"]


def test_v3_image_offloads_move_with_their_targets_as_dsh_migrates_them(oracle, tmp_path):
    log = _restarted_with_images(read_log(FIXTURES.parent / "dsh-0.1.5" / "tools.v3.jsonl.zstd"))
    written = write_mutations(log, tmp_path, _V3_IMAGE_MUTATIONS, file_name="session.v3.jsonl.zstd",
                              table=IMAGE_MUTATIONS)
    theirs = run_oracle(tmp_path)
    assert set(written) == set(_V3_IMAGE_MUTATIONS)
    disagreements = []
    for name, session_id in written.items():
        path = next(tmp_path.glob(f"*/{encode_segment(session_id)}/session.v3.jsonl.zstd"))
        problem = _disagreement(_ours(path), theirs[session_id], None)
        if problem is not None:
            disagreements.append((name, problem))
    assert disagreements == []
    control = theirs[written["control"]]
    assert control["ok"] and [event["type"] for event in control["events"]].count("turn/end") == 2
    offload = next(event for event in control["events"] if event["type"] == "image/offload")
    moved = offload["data"]["targets"][1]["seq"]
    assert moved == next(event["seq"] for event in log.events() if event["type"] == "image/offload") - 3 + 1
    assert [message["content"][2].get("offloaded") for message in control["messages"]
            if message["id"] == "user-restart"] == [True]
