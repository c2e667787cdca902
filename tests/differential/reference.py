"""Runs the reference implementation (the npm package under Node) on batches."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from dsh_core.jsonvalue import encode_json

DRIVER = Path(__file__).resolve().parents[2] / "tools" / "reference" / "driver.mjs"
REFERENCE_DIR = Path(os.environ.get("DSH_REFERENCE_DIR", Path.home() / ".cache" / "dsh-pipeline" / "reference"))


def unavailable_reason() -> str | None:
    """Why the reference cannot run here, or None. Only a missing Node skips;
    a missing install is a set-up error (``make reference`` installs it)."""
    if shutil.which("node") is None:
        return "node is not installed: differential tests against the reference need Node 20+"
    if not (REFERENCE_DIR / "node_modules" / "@deepseek-ai" / "dsh-session").is_dir():
        raise RuntimeError(f"reference package missing under {REFERENCE_DIR}: run `make reference`")
    return None


def run_reference(op: str, cases: list[Any]) -> list[Any]:
    payload = encode_json({"op": op, "cases": cases})
    done = subprocess.run(["node", str(DRIVER)], input=payload, capture_output=True, check=False,
                          env={**os.environ, "DSH_REFERENCE_DIR": str(REFERENCE_DIR)}, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"reference driver failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return json.loads(done.stdout)
