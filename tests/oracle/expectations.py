"""Write what dsh 0.2.1rc2's reader derives from each fixture log, beside it.

    python -m tests.oracle.expectations tests/fixtures/dsh-0.1.5 tests/fixtures/dsh-0.2.1

For every ``NAME.vN.jsonl.zstd`` it writes ``NAME.expected.json``: dsh's
verdict and, for an accepted log, the event count, surface nodes, derived
messages, request header and request context. The conformance tests
(``tests/conformance/test_formats.py``) compare ours with these without Node.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from tests.oracle import place_log, run_oracle


def expectations(folder: Path) -> dict[Path, dict]:
    logs = sorted(folder.glob("*.v[0-9]*.jsonl.zstd"))
    with tempfile.TemporaryDirectory() as root:
        placed = {log: place_log(log, Path(root)) for log in logs}
        theirs = run_oracle(Path(root))
    out = {}
    for log, session_id in placed.items():
        reading = theirs[session_id]
        if not reading["ok"]:
            out[log] = {"accepted": False, "category": reading["category"], "message": reading["message"]}
            continue
        out[log] = {"accepted": True, "eventCount": len(reading["events"]), "surfaceNodes": reading["surface"]["nodes"],
                    "replaceGeneration": len(reading["surface"]["replacements"]),
                    "derivedMessages": reading["messages"], "requestHeader": reading.get("requestHeader"),
                    "requestContext": reading.get("requestContext")}
    return out


def main(folders: list[str]) -> None:
    for folder in folders:
        for log, expected in expectations(Path(folder)).items():
            target = log.with_name(log.name.split(".v")[0] + ".expected.json")
            target.write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n", "utf-8")
            print(target)


if __name__ == "__main__":
    main(sys.argv[1:])
