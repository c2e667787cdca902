"""The gateway's credentials file: only its owner may read it, every line is
a client, and a mistake is named by file and line; the gateway does not
start without one."""

from __future__ import annotations

import pytest

from dsh_core.errors import PipelineError
from dsh_pipeline.cli import main
from dsh_pipeline.exit_codes import EXIT_REFUSED
from producers.gateway_admission import Credentials


def _file(tmp_path, text: str, mode: int = 0o600):
    path = tmp_path / "credentials"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_each_line_names_a_client_and_its_secret(tmp_path):
    credentials = Credentials.from_file(_file(tmp_path, "# the fleet\nci 0123456789abcdef\n"
                                                        "laptop  fedcba9876543210 # mine\n"))
    assert (credentials.client("0123456789abcdef"), credentials.client("fedcba9876543210")) == ("ci", "laptop")
    assert credentials.client("0123456789abcdeX") is None
    assert "0123456789abcdef" not in repr(credentials)


@pytest.mark.parametrize("text, mode, message", [
    ("ci 0123456789abcdef\n", 0o640, "others may read or change it (mode 0640): run `chmod 600 "),
    ("ci 0123456789abcdef\n", 0o604, "others may read or change it (mode 0604)"),
    ("ci 0123456789abcdef extra\n", 0o600, "line 1: is not NAME SECRET"),
    ("ci 0123456789abcdef\nci fedcba9876543210\n", 0o600, "line 2: repeats a name"),
    ("\nci short\n", 0o600, "line 2: has a secret of fewer than 16 characters"),
    ("# nobody\n", 0o600, "names no client"),
])
def test_a_file_others_can_read_or_a_malformed_line_is_refused_by_name(tmp_path, text, mode, message):
    path = _file(tmp_path, text, mode)
    with pytest.raises(PipelineError) as raised:
        Credentials.from_file(path)
    assert str(path) in raised.value.message and message in raised.value.message


def test_the_gateway_does_not_start_without_its_fleets_credentials(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("DSH_GATEWAY_CREDENTIALS_FILE", raising=False)
    assert main(["gateway", "--upstream", "http://127.0.0.1:9"]) == EXIT_REFUSED
    assert "the gateway lets only the fleet's clients through: --credentials-file FILE" in capsys.readouterr().err
    readable = _file(tmp_path, "ci 0123456789abcdef\n", 0o644)
    assert main(["gateway", "--upstream", "http://127.0.0.1:9", "--credentials-file", str(readable)]) == EXIT_REFUSED
    assert "others may read or change it (mode 0644)" in capsys.readouterr().err
