"""Sessions of any size in the read API and the viewer: a 49 MB and a 1 GB
session, each served by ``dsh-pipeline serve`` and opened in Chromium.

    python -m benchmarks.views [--sizes 49MB,1GB]

For each size, a SQLite view store holds one session whose surface events
(user messages, assistant messages with reasoning and tool calls, tool
results, one in twenty of 200 KB) take that many bytes, written as the
projector writes its rows (inserted directly: projecting a 1 GB log here
would take most of an hour and measure the projector, not the reads).
``serve`` (its own process) answers:

- the API's first page, a page in the middle of the session, and one long
  event whole (``/api/v1/events/{seq}``), timed over HTTP on loopback;
- the viewer's first page in headless Chromium (Debian's, via Playwright),
  signed in: time from navigation to the load event (``html_ms`` of it
  from the request to the page's last byte, ``render_ms`` from there to
  the load event), then the browser's memory (the proportional set size of
  all its processes) and the page's DOM nodes.

Baselines of the same run: the server's RSS before its first read, and the
browser's memory on the (small) session list before the session opens.
The last line is one JSON object, each figure's key ending in the size as
given (``_49mb``, ``_1gb``): ``first_page_ms``, ``html_ms``,
``render_ms``, ``api_first_page_ms``, ``api_middle_page_ms``,
``whole_event_ms``, ``server_peak_rss_mb`` (its ``VmHWM`` after all of
these), ``server_start_rss_mb``, ``browser_pss_mb``,
``browser_list_pss_mb``, ``dom_nodes``, ``page_bytes``, ``messages_shown``
and ``session_mb``. Goals: the 1 GB session's first page within 1000 ms,
with the server's peak RSS within 300 MB.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

from consumers.projector.store import ViewStore, message_texts
from dsh_core.jsonvalue import encode_json

TOKEN = "views-benchmark-token"
_UNITS = {"kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30}
_WORDS = ("the", "agent", "reads", "files", "and", "runs", "tests", "then", "it", "writes", "a", "patch", "src/",
          "main.py", "ok", "failed", "diff", "--git")


def parse_size(text: str) -> int:
    found = re.fullmatch(r"([0-9]+)(kb|mb|gb)", text.strip().lower())
    if found is None:
        raise SystemExit(f"--sizes: {text!r} is not a size such as 49MB or 1GB")
    return int(found.group(1)) * _UNITS[found.group(2)]


def _text(rng: random.Random, size: int) -> str:
    words = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


def build_store(location: Path, session_id: str, target: int, seed: int = 7) -> dict[str, Any]:
    """A view store holding one session of ``target`` bytes of surface events."""
    ViewStore(location).close()  # the schema, in this build's layout
    rng = random.Random(seed)
    db = sqlite3.connect(location)
    written, seq, turn = 0, 0, 0
    turns: list[dict[str, Any]] = []
    tokens = [0, 0]
    batch: list[tuple] = []

    def put(kind: str, data: dict[str, Any]) -> None:
        nonlocal written, seq
        text = encode_json(data).decode()
        batch.append((session_id, seq, kind, text, "\n".join(message_texts(data)).lower()[:256]))
        written += len(text)
        seq += 1
        if len(batch) >= 2_000:
            db.executemany("INSERT INTO surface (session_id, seq, type, data, text) VALUES (?, ?, ?, ?, ?)", batch)
            batch.clear()

    while written < target:
        turn += 1
        first = seq
        put("user/message", {"id": f"u-{turn}", "role": "user", "source": {"kind": "user"},
                             "content": [{"type": "text", "text": _text(rng, rng.randint(80, 1_500))}]})
        for step in range(1, rng.randint(2, 4)):
            call = f"call-{turn}-{step}"
            usage = {"inputTokens": rng.randint(2_000, 60_000), "outputTokens": rng.randint(50, 2_000)}
            tokens[0] += usage["inputTokens"]
            tokens[1] += usage["outputTokens"]
            put("assistant/message", {"turn": turn, "step": step, "usage": usage, "message": {
                "id": f"a-{turn}-{step}", "role": "assistant",
                "source": {"kind": "model", "provider": "deepseek", "model": "deepseek-chat"},
                "content": [{"type": "reasoning", "text": _text(rng, rng.randint(200, 4_000))},
                            {"type": "text", "text": _text(rng, rng.randint(50, 1_500))},
                            {"type": "tool-call", "id": call, "name": "shell",
                             "arguments": json.dumps({"command": _text(rng, 60)})}]}})
            result = 200_000 if rng.random() < 0.05 else rng.randint(200, 12_000)
            put("tool/result", {"turn": turn, "step": step, "message": {
                "id": f"t-{turn}-{step}", "role": "user", "source": {"kind": "tool", "callId": call},
                "content": [{"type": "tool-result", "toolCallId": call, "isError": False,
                             "content": [{"type": "text", "text": _text(rng, result)}]}]}})
        turns.append({"turn": turn, "seq": first, "steps": step, "reason": {"kind": "completed"}})
    if batch:
        db.executemany("INSERT INTO surface (session_id, seq, type, data, text) VALUES (?, ?, ?, ?, ?)", batch)
    created = 1_767_225_600_000
    usage_rows = [{"provider": "deepseek", "model": "deepseek-chat", "inputTokens": tokens[0], "outputTokens": tokens[1]}]
    view = {"sessionId": session_id, "status": "idle", "header": {"version": 0, "id": session_id,
                                                                 "createdAt": created, "cwd": "/srv/agent"},
            "nextSeq": seq, "turns": turns, "lastTurnEnd": turns[-1]["reason"], "usage": usage_rows,
            "surfaceLength": seq, "replaceGeneration": 0, "messageCount": seq, "requestHeaderChanges": []}
    db.execute("INSERT INTO sessions (session_id, status, next_seq, view, cwd, created_at, last_activity, turn_count, "
               "message_count) VALUES (?, 'idle', ?, ?, ?, ?, ?, ?, ?)",
               (session_id, seq, encode_json(view).decode(), "/srv/agent", created, created + seq * 1000, turn, seq))
    db.execute("INSERT INTO usage (session_id, provider, model, inputTokens, outputTokens) VALUES (?, ?, ?, ?, ?)",
               (session_id, "deepseek", "deepseek-chat", *tokens))
    db.commit()
    db.close()
    return {"events": seq, "bytes": written}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def served(store: Path, workdir: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """``dsh-pipeline serve`` on the store, in a process of its own."""
    tokens = workdir / "tokens"
    tokens.write_text(TOKEN + "\n")
    tokens.chmod(0o600)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", "from dsh_pipeline.cli import main; raise SystemExit(main())",
                               "serve", "--store", str(store), "--listen", f"127.0.0.1:{port}",
                               "--tokens-file", str(tokens), "--log-level", "WARNING"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not answer on {url} (exit {server.poll()})")
            time.sleep(0.1)
        yield server, url
    finally:
        server.terminate()
        server.wait(timeout=30)


def _status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def _pss_mb(pid: int) -> float:
    """A process's proportional set size: its resident memory, each page
    it shares counted in part (summing resident sets counts shared
    libraries once per process)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _browser_pss_mb() -> float:
    """The memory of every Chromium process under this one (:func:`_pss_mb`)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    total, todo = 0.0, list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            if "chrom" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace"):
                total += _pss_mb(pid)
        todo += children.get(pid, [])
    return total


def _timed(client: httpx.Client, path: str, **params: Any) -> tuple[float, httpx.Response]:
    started = time.perf_counter()
    answer = client.get(path, params=params)
    elapsed = (time.perf_counter() - started) * 1000
    answer.raise_for_status()
    return elapsed, answer


def measure(url: str, server: subprocess.Popen, session_id: str, events: int) -> dict[str, float]:
    started_rss = _status_mb(server.pid, "VmRSS")  # serving, nothing read yet
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as client:
        api_first, first = _timed(client, f"/api/v1/sessions/{session_id}")
        api_middle, _ = _timed(client, f"/api/v1/sessions/{session_id}", after=events // 2)
        long_seq = next((e["seq"] for e in first.json()["surface"] if "preview" in e), first.json()["surface"][0]["seq"])
        whole, _ = _timed(client, f"/api/v1/events/{long_seq}", session=session_id)
    from playwright.sync_api import sync_playwright
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium on PATH (make chromium installs Debian's)")
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(f"{url}/login")
            page.fill("#token", TOKEN)
            page.click("button[type=submit]")
            page.wait_for_selector("main")
            baseline = _browser_pss_mb()  # signed in, on the session list
            started = time.perf_counter()
            page.goto(f"{url}/sessions/{session_id}", wait_until="load")
            viewer = (time.perf_counter() - started) * 1000
            timing = page.evaluate("(() => { const t = performance.getEntriesByType('navigation')[0]; "
                                   "return [t.responseEnd - t.requestStart, t.loadEventEnd - t.responseEnd]; })()")
            shown = page.locator("#conversation > li").count()
            devtools = page.context.new_cdp_session(page)
            devtools.send("Performance.enable")
            metrics = {m["name"]: m["value"] for m in devtools.send("Performance.getMetrics")["metrics"]}
            browser_memory = _browser_pss_mb()
            page_bytes = len(page.content().encode())
        finally:
            browser.close()
    return {"first_page_ms": round(viewer, 1), "html_ms": round(timing[0], 1), "render_ms": round(timing[1], 1),
            "api_first_page_ms": round(api_first, 1),
            "api_middle_page_ms": round(api_middle, 1), "whole_event_ms": round(whole, 1),
            "server_peak_rss_mb": round(_status_mb(server.pid, "VmHWM"), 1),
            "server_start_rss_mb": round(started_rss, 1), "browser_pss_mb": round(browser_memory, 1),
            "browser_list_pss_mb": round(baseline, 1),
            "dom_nodes": int(metrics.get("Nodes", 0)),
            "page_bytes": page_bytes, "messages_shown": shown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="49MB,1GB", help="the sessions' sizes (default 49MB,1GB)")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for label in [size.strip().lower() for size in args.sizes.split(",")]:
        target = parse_size(label)
        with tempfile.TemporaryDirectory(prefix="dsh-views-bench-") as workdir:
            store, session_id = Path(workdir) / "views.sqlite", f"bench-{label}"
            started = time.perf_counter()
            built = build_store(store, session_id, target)
            print(f"{label}: built {built['bytes'] / (1 << 20):.0f} MB of surface events ({built['events']} events) "
                  f"in {time.perf_counter() - started:.0f} s", flush=True)
            with served(store, Path(workdir)) as (server, url):
                figures = measure(url, server, session_id, built["events"])
            figures["session_mb"] = round(built["bytes"] / (1 << 20), 1)
            print(f"{label}: " + ", ".join(f"{key} {value}" for key, value in figures.items()), flush=True)
            results |= {f"{key}_{label}": value for key, value in figures.items()}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
