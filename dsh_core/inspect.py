"""``inspect``: load session files and report them (conformance JSON or a summary).

The JSON report has exactly the fields and meanings of the corpus's
``NAME.expected.json`` files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .analysis import LogAnalysis
from .errors import DshError
from .jsonvalue import encode_json
from .storage.framing import frame_pieces, iter_frames
from .loader import load_session
from .storage.reader import LoadResult

__all__ = ["InspectReport", "inspect_path", "expand_inputs", "error_json"]


def expand_inputs(path: str | os.PathLike[str]) -> list[Path]:
    """A file stands for itself; a directory for every session file under it
    (``session.jsonl`` / ``session.jsonl.zstd``, or any ``*.jsonl[.zstd]``), sorted."""
    path = Path(path)
    if not path.is_dir():
        return [path]
    found = sorted(p for p in path.rglob("*") if p.is_file() and (p.name.endswith(".jsonl") or p.name.endswith(".jsonl.zstd")))
    return found


def error_json(error: DshError | None) -> Any:
    if error is None:
        return None
    cause = error.__cause__ if isinstance(error.__cause__, DshError) else None
    return {"name": type(error).__name__, "type": type(error).__name__, "message": error.message,
            "cause": error_json(cause), "category": error.category}


class InspectReport:
    """One inspected session: the load result and its analysis."""

    def __init__(self, path: Path, keep_requests: bool) -> None:
        self.path = path
        self.analysis = LogAnalysis(keep_requests=keep_requests)
        self.result: LoadResult = load_session(path, observer=self.analysis)

    def repaired_log(self) -> str:
        """The whole log as repair would leave it (the logical JSONL text)."""
        result = self.result
        closer_text = b"".join(encode_json(c) + b"\n" for c in result.closers)
        if result.compression == "none":
            with open(self.path, "rb") as stream:
                kept = stream.read(result.committed_bytes)
            return (kept + closer_text).decode("utf-8", "replace")
        parts: list[bytes] = []
        with open(self.path, "rb") as stream:
            for frame in iter_frames(stream, str(self.path)):
                if frame.complete:
                    parts.extend(frame_pieces(stream, frame, str(self.path)))
        parts.extend(line + b"\n" for line in result.recovered_lines)
        return (b"".join(parts) + closer_text).decode("utf-8", "replace")

    def to_json(self) -> dict[str, Any]:
        result, analysis = self.result, self.analysis
        if not result.accepted:
            return {"accepted": False, "error": error_json(result.error), "sessionHeader": None,
                    "eventCount": None, "surfaceNodes": None, "replaceGeneration": None,
                    "derivedMessages": None, "requestHeader": None, "requestContext": None,
                    "turns": None, "requests": None, "repair": None}
        state, header = result.state, result.header
        assert state is not None and header is not None, "an accepted log has its header and state"
        repair = None
        if result.repaired:
            repair = {"droppedBytes": result.dropped_bytes, "droppedText": result.dropped_text,
                      "closerCount": len(result.closers), "closers": result.closers,
                      "repairedLog": self.repaired_log()}
        return {
            "accepted": True,
            "error": None,
            "sessionHeader": header.to_dict(),
            "eventCount": result.event_count,
            "surfaceNodes": list(state.surface.nodes),
            "replaceGeneration": state.surface.replace_generation,
            "derivedMessages": state.messages(),
            "requestHeader": state.header,
            "requestContext": state.context,
            "turns": analysis.turns,
            "requests": analysis.requests,
            "repair": repair,
        }

    def summary(self) -> str:
        result, analysis = self.result, self.analysis
        if not result.accepted:
            error = result.error
            assert error is not None, "a refused log has its error"
            return f"{self.path}: REFUSED [{error.category}] {type(error).__name__}: {error.message}"
        header, state = result.header, result.state
        assert state is not None and header is not None, "an accepted log has its header and state"
        reasons = ", ".join(f"{k}={v}" for k, v in sorted(analysis.end_reasons.items())) or "none"
        lines = [f"{self.path}: session {header.id} (v{header.version}, {result.compression}), {result.event_count} events, "
                 f"{len(analysis.turns)} turns, {analysis.steps} steps, {analysis.request_count} requests",
                 f"  turn ends: {reasons}",
                 f"  messages: {state.message_count()}, surface nodes: {len(state.surface.nodes)}, "
                 f"replacements: {state.surface.replace_generation}"]
        for (provider, model), totals in sorted(analysis.usage.items()):
            used = ", ".join(f"{k}={v}" for k, v in totals.items())
            lines.append(f"  tokens {provider}/{model}: {used}")
        if result.repaired:
            lines.append(f"  repair: dropped {result.dropped_bytes} bytes, {len(result.closers)} closers "
                         f"({', '.join(c['type'] for c in result.closers)})")
        else:
            lines.append("  problems: none")
        return "\n".join(lines)


def inspect_path(path: Path, keep_requests: bool = True) -> InspectReport:
    return InspectReport(path, keep_requests)
