"""Real dsh agents beside the demo's simulated fleet (``demo --real-agents N``).

The scripted chat-completions model (:mod:`dsh_pipeline.scripted_chat`)
runs in the demo's own process, on a thread and event loop of its own:
it is light (a few dozen streamed replies), it needs no start-up handshake
beyond its bound socket, and the demo can count the requests it answered,
which every gateway verdict must account for. In front of it runs ONE
``dsh-pipeline gateway`` process on the demo's topics, and behind that N
``dsh-pipeline worker --runtime jsonrpc --no-gateway`` processes, each a
dsh 0.1.1rc1 JSON-RPC agent with its own workspace, home and session root
under the run folder, its scripts taken in turns from :data:`AGENT_SCRIPTS`.
Once every worker is done, the gateway is stopped (SIGTERM: it publishes
what it still holds). At the end the auditor's ``/metrics`` tell how each
request the gateway attested was judged.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.metadata
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from dsh_core.errors import PipelineError
from dsh_core.storage.layout import encode_segment, find_session_files
from dsh_pipeline.scripted_chat import ScriptedChatServer

__all__ = ["AGENT_SCRIPTS", "DEFAULT_REAL_AGENTS", "RUNTIME_VERSION", "RealAgents", "default_real_agents",
           "runtime_problem", "wire_verdicts"]

RUNTIME_VERSION = "0.1.1rc1"
DEFAULT_REAL_AGENTS = 8
#: (script, turns) of agent k, in turns; one round asks the model 16 times.
AGENT_SCRIPTS = (("plain", 1), ("tools", 1), ("parallel", 1), ("retry", 1), ("max-tokens", 1), ("two-turns", 2),
                 ("reasoned-tools", 2), ("chain", 1))
#: What the agents present as their model API key: the scripted model takes any.
_API_KEY = "sk-demo-scripted-model"
_GATEWAY_LINE = re.compile(rb"dsh-pipeline gateway: (http://\S+) forwards to")


def runtime_problem() -> str | None:
    """Why real agents cannot run here, or ``None``: the runtime wheel of
    :data:`RUNTIME_VERSION` must be installed (linux x86_64)."""
    from producers.bridge import find_runtime
    try:
        find_runtime()
        version = importlib.metadata.version("deepseek-harness-runtime-bin")
    except PipelineError as error:
        return error.message
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    if version != RUNTIME_VERSION:
        return (f"the installed dsh runtime is {version}, not {RUNTIME_VERSION}: "
                f"pip install 'deepseek-harness-runtime-bin=={RUNTIME_VERSION}'")
    return None


def default_real_agents() -> int:
    """``--real-agents``'s default: :data:`DEFAULT_REAL_AGENTS` where the
    runtime is installed, else 0 (and one line saying why)."""
    problem = runtime_problem()
    if problem is None:
        return DEFAULT_REAL_AGENTS
    print(f"real agents skipped: {problem}", flush=True)
    return 0


def wire_verdicts(metrics_url: str) -> collections.Counter:
    """``dsh_audit_wire_requests_total`` of a service's ``/metrics``, by (kind, verdict)."""
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    counts: collections.Counter = collections.Counter()
    for family in text_string_to_metric_families(text):
        if family.name == "dsh_audit_wire_requests":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[(sample.labels["kind"], sample.labels["verdict"])] += int(sample.value)
    return counts


def _private_file(path: Path, text: str) -> Path:
    """``path`` made anew with ``text``, readable by its owner only."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as file:
        file.write(text)
    return path


class RealAgents:
    """The scripted model, the gateway and ``count`` workers; ``poll()`` is
    ``None`` while any of them runs (like :class:`subprocess.Popen`'s), 0
    after. A failure is kept in :attr:`problems`, not raised."""

    def __init__(self, count: int, run: Path, cli: Callable[..., list[str]], common: list[str],
                 timeout: float = 300.0) -> None:
        self.count, self.cli, self.common, self.timeout = count, cli, common, timeout
        self.folder, self.logs = run / "real-agents", run / "logs"
        self.model = ScriptedChatServer()
        self.gateway: subprocess.Popen | None = None
        self.gateway_url = ""
        self.workers: dict[str, subprocess.Popen] = {}  # session id -> its worker
        self.problems: list[str] = []
        self.returncode: int | None = None
        self._copier: threading.Thread | None = None
        self._model = contextlib.ExitStack()
        self._deadline = 0.0
        self._stopping = 0.0  # when the gateway, asked to stop, is killed

    @staticmethod
    def session_id(k: int) -> str:
        return f"real-{k}"

    def start(self) -> None:
        self._model.enter_context(self.model)
        log = open(self.logs / "gateway.log", "wb")
        # each agent is a client of the fleet: it shows its own credential as its API key; the gateway holds the model's
        credentials = {self.session_id(k): secrets.token_urlsafe(24) for k in range(1, self.count + 1)}
        self.folder.mkdir(parents=True, exist_ok=True)
        credentials_file = _private_file(self.folder / "gateway-credentials",
                                         "".join(f"{name} {secret}\n" for name, secret in credentials.items()))
        key_file = _private_file(self.folder / "model-key", _API_KEY)
        self.gateway = subprocess.Popen(self.cli("gateway", "--listen", "127.0.0.1:0", "--upstream", self.model.url,
                                                 "--credentials-file", str(credentials_file), "--upstream-key-file",
                                                 str(key_file), *self.common), stdout=log, stderr=subprocess.PIPE)
        self.gateway_url = self._gateway_url(log, time.monotonic() + 60)
        self._deadline = time.monotonic() + self.timeout
        for k in range(1, self.count + 1):
            env = {**os.environ, "DEEPSEEK_API_KEY": credentials[self.session_id(k)]}
            name, turns = AGENT_SCRIPTS[(k - 1) % len(AGENT_SCRIPTS)]
            home = self.folder / f"real-{k}"
            for part in ("workspace", "home", "sessions"):
                (home / part).mkdir(parents=True)
            prompts = [arg for turn in range(turns) for arg in ("--prompt", f"[script:{name}#{k}] turn {turn + 1}: go")]
            self.workers[self.session_id(k)] = subprocess.Popen(
                self.cli("worker", "--runtime", "jsonrpc", "--no-gateway", "--model-url", self.gateway_url,
                         "--session-id", self.session_id(k), *prompts, "--workspace", str(home / "workspace"),
                         "--home", str(home / "home"), "--session-root", str(home / "sessions"), *self.common),
                stdout=open(self.logs / f"real-{k}.log", "wb"), stderr=subprocess.STDOUT, env=env)

    def _gateway_url(self, log, deadline: float) -> str:
        """The address the gateway prints once it listens; its stderr goes
        on to ``log`` (a thread copies it)."""
        assert self.gateway is not None and self.gateway.stderr is not None
        stream, seen = self.gateway.stderr, b""
        with selectors.DefaultSelector() as selector:
            selector.register(stream, selectors.EVENT_READ)
            while (match := _GATEWAY_LINE.search(seen)) is None:
                left = deadline - time.monotonic()
                chunk = os.read(stream.fileno(), 65536) if left > 0 and selector.select(left) else None
                if not chunk:
                    log.write(seen)
                    log.close()
                    self.gateway.kill()
                    why = "exited" if chunk == b"" else "did not start listening within 60 s"
                    raise PipelineError(f"the demo's gateway {why}; see {self.logs / 'gateway.log'}")
                seen += chunk
        log.write(seen)
        log.flush()

        def copy() -> None:
            with log:
                shutil.copyfileobj(stream, log, 4096)

        self._copier = threading.Thread(target=copy, name="gateway-log", daemon=True)
        self._copier.start()
        return match.group(1).decode()

    def poll(self) -> int | None:
        """``None`` while agents or the gateway run; once every worker is
        done, stop the gateway (it publishes what it holds, then exits)."""
        if self.returncode is not None:
            return self.returncode
        running = [sid for sid, worker in self.workers.items() if worker.poll() is None]
        if running and time.monotonic() > self._deadline:
            for sid in running:
                self.workers[sid].kill()
                self.workers[sid].wait()
                self.problems.append(f"{sid}: the worker did not finish within {self.timeout:.0f} s "
                                     f"({self._last_line(sid)})")
            running = []
        if running:
            return None
        assert self.gateway is not None
        if self.gateway.poll() is None:
            if not self._stopping:
                self._stopping = time.monotonic() + 60
                self.gateway.send_signal(signal.SIGTERM)
            elif time.monotonic() > self._stopping:
                self.gateway.kill()
                self.gateway.wait()
                self.problems.append(f"the gateway did not stop within 60 s of SIGTERM "
                                     f"({self._last_line('gateway')})")
            else:
                return None
        self.problems += [f"{sid}: the worker exited with code {worker.returncode} ({self._last_line(sid)})"
                          for sid, worker in self.workers.items() if worker.returncode]
        if self.gateway.returncode and self.gateway.returncode != -signal.SIGKILL:
            self.problems.append(f"the gateway exited with code {self.gateway.returncode} "
                                 f"({self._last_line('gateway')})")
        self.returncode = 0
        return 0

    def _last_line(self, name: str) -> str:
        """The last line of a process's log, and where the log is."""
        path = self.logs / f"{name}.log"
        lines = path.read_bytes().decode(errors="replace").strip().splitlines() if path.exists() else []
        return f"{lines[-1].strip()[:300] if lines else 'no output'}; log {path}"

    def session_files(self) -> dict[str, Path]:
        """Each agent's session file, as its dsh runtime wrote it (a missing
        one is a problem)."""
        files = {}
        for k in range(1, self.count + 1):
            session_id = self.session_id(k)
            root = self.folder / session_id / "sessions"
            found = [p for p in find_session_files(root) if p.parent.name == encode_segment(session_id)]
            if len(found) == 1:
                files[session_id] = found[0]
            else:
                self.problems.append(f"{session_id}: {len(found)} session files under {root}, expected one")
        return files

    def report(self, metrics_url: str) -> str:
        """The report's line; what disagrees is added to :attr:`problems`."""
        served = self.model.app.requests
        try:
            verdicts = wire_verdicts(metrics_url)
        except Exception as error:  # noqa: BLE001 - a report line, not a crash
            self.problems.append(f"real agents: the auditor's metrics at {metrics_url} could not be read "
                                 f"({type(error).__name__}: {error})")
            verdicts = collections.Counter()
        agent = {verdict: n for (kind, verdict), n in verdicts.items() if kind == "agent"}
        classified = sum(n for (kind, _), n in verdicts.items() if kind != "agent")
        verified = agent.get("verified", 0)
        others = {verdict: n for verdict, n in agent.items() if verdict != "verified" and n}
        if others:
            self.problems.append(f"real agents: requests not verified: {others}")
        if verified + classified != served:
            self.problems.append(f"real agents: the model answered {served} requests, the auditor judged "
                                 f"{verified + classified + sum(others.values())} ({verified} verified)")
        extra = f", {classified} titles/compactions classified" if classified else ""
        return (f"  real agents {self.count} ({RUNTIME_VERSION} via the gateway): {verified} requests verified, "
                f"{agent.get('mismatch', 0)} mismatch, {agent.get('unlogged', 0)} unlogged, "
                f"{agent.get('unattested', 0)} unattested{extra} (the model answered {served})")

    def close(self) -> None:
        """Stop whatever still runs (after a failure elsewhere)."""
        for process in (*self.workers.values(), self.gateway):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        if self._copier is not None:
            self._copier.join(10)
        self._model.close()
