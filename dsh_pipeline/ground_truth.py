"""What the pipeline produced, compared with what the simulator knows it sent.

The simulator's manifest holds, for every session, the ground truth it
computed on its own side of Kafka: the next seq, the digest of the derived
messages, and each injected defect (kind and seq). Because that truth never
passes through the consumers, agreement with it shows the whole pipeline —
shipping, ordering, dead-lettering, projection, auditing, archiving — lost,
added and changed nothing. Three outputs are checked:

* **views** (the projector's store): a clean session's view has the true
  digest and next seq; a session with a dropped event is held at the gap;
  one with an unknown required event is refused;
* **archive** (the archiver's dsh layout): a clean session's file loads and
  holds exactly the shipped events, deriving the same messages; a session
  with a gap stops at it;
* **findings** (the auditor's): exactly the defects the auditor must see,
  as ``(session, rule, seq)`` with multiplicity — one missed or one extra is
  a disagreement. Duplicates are no finding: consumers drop exact repeats.

Real dsh agents may share the topics (the demo's ``--real-agents``). They
are not in the manifest: their truth is the session file dsh itself wrote
(``real``: session id -> that file), which never passed through Kafka. Their
view must be idle with the file's next seq and messages, their archive must
hold exactly the file's header and events, and no finding may name them.
A session neither simulated nor real is a disagreement where it shows:
in the archive, or in a finding (its view is not looked for).

Each check returns the disagreements as lines; none means all agree.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from dsh_core.storage.layout import encode_segment, find_session_files
from dsh_core.loader import load_session, read_events
from producers.simulator import messages_digest

__all__ = ["EXPECTED_RULE", "compare", "compare_findings", "compare_real_sessions", "compare_sessions"]

#: The auditor rule each injected defect kind must raise, at the defect's seq.
EXPECTED_RULE = {"unlogged": "request-mismatch", "dropped": "sequence-gap", "lossless": "lossless",
                 "unknown": "unsupported-format"}

#: A session's truth as the manifest has it (``producers.simulator.SimulatedSession.to_json``).
Truth = Mapping[str, Any]


def compare(manifest: Mapping[str, Any], views: Path | str, archive: Path, findings: Iterable[Mapping[str, Any]],
            real: Mapping[str, Path] | None = None) -> list[str]:
    """Every disagreement of the view store at ``views``, the archive root
    ``archive`` and the auditor's ``findings`` with ``manifest`` and the
    ``real`` agents' session files."""
    from consumers.projector import ViewStore  # only here: the checks below need no consumer code
    truths, real = manifest["truth"], real or {}
    archived = {p.parent.name: p for p in find_session_files(archive)}
    known = {encode_segment(session_id) for session_id in (*truths, *real)}
    store = ViewStore(views)
    try:
        problems = compare_sessions(truths, store.view, archived) + compare_real_sessions(real, store.view, archived)
    finally:
        store.close()
    problems += [f"{name}: archived, but neither simulated nor a real agent's" for name in sorted(archived)
                 if name not in known]
    return problems + compare_findings(truths, findings, real)


def compare_sessions(truths: Mapping[str, Truth], view_of: Callable[[str], Mapping[str, Any] | None],
                     archived: Mapping[str, Path]) -> list[str]:
    """Each session's view (``view_of(session_id)``, ``None`` if absent) and
    archive file (by session directory name) against its truth."""
    problems = []
    for session_id, truth in truths.items():
        kinds = {d["kind"] for d in truth["defects"]}
        view = view_of(session_id)
        path = archived.get(session_id)
        if view is None or path is None:
            problems.append(f"{session_id}: missing {'view' if view is None else 'archive'}")
            continue
        if "dropped" in kinds:
            gap = next(d["seq"] for d in truth["defects"] if d["kind"] == "dropped")
            if view["status"] != "held" or view.get("heldFrom") != gap:
                problems.append(f"{session_id}: expected a view held at seq {gap}, got {view['status']}")
            if len(read_events(path)[1]) != gap:
                problems.append(f"{session_id}: archive should stop at the gap (seq {gap})")
        elif "unknown" in kinds:
            if view["status"] != "refused":
                problems.append(f"{session_id}: expected a refused view, got {view['status']}")
        else:
            if view.get("messagesDigest") != truth["messages_digest"] or view["nextSeq"] != truth["next_seq"]:
                problems.append(f"{session_id}: view differs from ground truth")
            loaded = load_session(path)
            if not loaded.accepted or loaded.stored_count != truth["next_seq"] or loaded.state is None or \
                    messages_digest(loaded.state.messages()) != truth["messages_digest"]:
                problems.append(f"{session_id}: archive differs from the shipped log")
    return problems


def compare_real_sessions(real: Mapping[str, Path], view_of: Callable[[str], Mapping[str, Any] | None],
                          archived: Mapping[str, Path]) -> list[str]:
    """Each real agent's view and archive file against the session file its
    dsh runtime wrote (``real``: session id -> that file)."""
    problems = []
    for session_id, source in sorted(real.items()):
        header, events = read_events(source)
        loaded = load_session(source)
        view = view_of(session_id)
        if view is None:
            problems.append(f"{session_id}: missing view (a real agent's session)")
        elif view["status"] != "idle":
            problems.append(f"{session_id}: expected an idle view of the real agent's session, got {view['status']}")
        elif view["nextSeq"] != len(events) or not loaded.accepted or loaded.state is None or \
                view.get("messagesDigest") != messages_digest(loaded.state.messages()):
            problems.append(f"{session_id}: view differs from the real agent's session file {source}")
        path = archived.get(encode_segment(session_id))
        if path is None:
            problems.append(f"{session_id}: missing archive (a real agent's session)")
        elif read_events(path) != (header, events):
            problems.append(f"{session_id}: archive differs from the real agent's session file {source}")
    return problems


def compare_findings(truths: Mapping[str, Truth], findings: Iterable[Mapping[str, Any]],
                     real: Iterable[str] = ()) -> list[str]:
    """The findings (``session``, ``rule``, ``seq`` of each) against the
    injected defects: the missed ones, then the unexpected ones, sorted;
    then every finding naming a ``real`` agent's session (none is expected)."""
    real = set(real)
    findings = list(findings)
    expected = collections.Counter((sid, EXPECTED_RULE[d["kind"]], d["seq"]) for sid, t in truths.items()
                                   for d in t["defects"] if d["kind"] in EXPECTED_RULE)
    got = collections.Counter((f["session"], f["rule"], f["seq"]) for f in findings if f["session"] not in real)
    return [f"missed finding {item}" for item in sorted(expected - got)] + \
           [f"unexpected finding {item}" for item in sorted(got - expected)] + \
           [f"finding for the real agent's session {f['session']}: {f['rule']} at seq {f['seq']}: {f.get('detail')}"
            for f in findings if f["session"] in real]
