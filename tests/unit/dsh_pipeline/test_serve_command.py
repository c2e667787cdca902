"""``dsh-pipeline serve`` refuses a tokens file its group or others may
read or change, by name, with the exit code of a refusal and the fix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dsh_pipeline.exit_codes import EXIT_REFUSED


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o666])
def test_serve_refuses_a_tokens_file_others_can_reach(tmp_path, monkeypatch, mode):
    monkeypatch.delenv("DSH_API_TOKENS", raising=False)
    tokens = tmp_path / "tokens"
    tokens.write_text("abc123\n")
    tokens.chmod(mode)
    done = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "serve", "--store", str(tmp_path / "views.sqlite"),
                           "--tokens-file", str(tokens)], capture_output=True, text=True, check=False)
    assert done.returncode == EXIT_REFUSED and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"dsh-pipeline serve: ExposedSecretError: --tokens-file {tokens}: its group or "
                                  f"others may read or change it (mode {mode:04o})"), done.stderr
    assert f"chmod 600 {tokens}" in done.stderr and "abc123" not in done.stderr
