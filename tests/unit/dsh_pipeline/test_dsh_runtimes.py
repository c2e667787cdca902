"""Which executable a cached runtime release is, read from its marker (no download)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsh_core.errors import PipelineError
from dsh_pipeline.dsh_runtimes import (EXECUTABLE_IN_WHEEL, JSONRPC_AGENT_IN_WHEEL, jsonrpc_agent,
                                       runtime_executable, runtimes_root)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return runtimes_root()


def _unpacked(cache: Path, version: str, inside: str, marker: dict) -> Path:
    executable = cache / version / inside
    executable.parent.mkdir(parents=True)
    executable.write_bytes(b"")
    (cache / version / ".complete").write_text(json.dumps(marker))
    return executable


def test_a_release_before_the_cli_is_its_json_rpc_agent_with_its_cordis_yml(cache):
    executable = _unpacked(cache, "0.1.0rc7", JSONRPC_AGENT_IN_WHEEL, {"executable": JSONRPC_AGENT_IN_WHEEL})
    executable.with_name("cordis.yml").write_text("[]\n")
    assert runtime_executable("0.1.0rc7") == executable
    assert jsonrpc_agent("0.1.0rc7") == (executable, executable.with_name("cordis.yml"))


def test_a_marker_naming_no_executable_is_the_cli(cache):
    executable = _unpacked(cache, "0.2.1rc2", EXECUTABLE_IN_WHEEL, {"requirement": "x"})
    assert runtime_executable("0.2.1rc2") == executable
    with pytest.raises(PipelineError, match="0.2.1rc2 ships deepseek-harness-sdk-runtime-linux-x64, not the "
                                            "JSON-RPC agent dsh-jsonrpc-agent-pkg-linux-x64"):
        jsonrpc_agent("0.2.1rc2")


def test_an_agent_without_its_cordis_yml_is_refused(cache):
    _unpacked(cache, "0.1.1rc1", JSONRPC_AGENT_IN_WHEEL, {"executable": JSONRPC_AGENT_IN_WHEEL})
    with pytest.raises(PipelineError, match="dsh runtime 0.1.1rc1: no cordis.yml beside"):
        jsonrpc_agent("0.1.1rc1")
