"""OAUTHBEARER token sources: a file read again when it changes, a command
run again before its token expires, and one-line errors naming the source."""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time

import pytest

from dsh_core.errors import PipelineError
from dsh_kafka.config import KafkaConfig
from dsh_kafka.oauth import TokenProvider, TokenSource, token_expiry


def _jwt(exp: float | None) -> str:
    claims = {"sub": "dsh"} | ({"exp": exp} if exp is not None else {})
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"eyJhbGciOiJub25lIn0.{body}."


def test_a_file_token_is_read_again_when_the_file_changes(tmp_path):
    path = tmp_path / "token"
    path.write_text("first\n")
    provider = TokenProvider(TokenSource("file", str(path)))
    assert asyncio.run(provider.token()) == "first"
    path.write_text("second, rotated by the token agent\n")
    assert asyncio.run(provider.token()) == "second, rotated by the token agent"


def test_a_command_token_is_reused_until_shortly_before_it_expires(tmp_path):
    count = tmp_path / "runs"
    script = (f"import pathlib,sys; p=pathlib.Path({str(count)!r}); p.write_text(str(int(p.read_text() or 0)+1) "
              f"if p.exists() else '1'); print(sys.argv[1])")
    soon, later = _jwt(time.time() + 10), _jwt(time.time() + 3600)
    provider = TokenProvider(TokenSource("command", f"{sys.executable} -c {json.dumps(script)} {later}"))
    assert [asyncio.run(provider.token()) for _ in range(3)] == [later] * 3 and count.read_text() == "1"
    expiring = TokenProvider(TokenSource("command", f"{sys.executable} -c {json.dumps(script)} {soon}"))
    asyncio.run(expiring.token())
    asyncio.run(expiring.token())  # within 30 s of exp: fetched again
    assert count.read_text() == "3"
    assert token_expiry(later) == pytest.approx(time.time() + 3600, abs=5) and token_expiry("opaque") is None


def test_a_token_that_cannot_be_had_is_named_without_showing_it(tmp_path):
    failing = TokenProvider(TokenSource("command", f"{sys.executable} -c \"import sys; sys.exit('no session')\""))
    with pytest.raises(PipelineError, match="token command .* exited 1 without a token: no session"):
        asyncio.run(failing.token())
    with pytest.raises(PipelineError, match=f"the token file {tmp_path / 'gone'}: No such file"):
        asyncio.run(TokenProvider(TokenSource("file", str(tmp_path / "gone"))).token())


def test_oauthbearer_needs_exactly_one_token_source():
    env = {"DSH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "DSH_KAFKA_SASL_MECHANISM": "OAUTHBEARER"}
    with pytest.raises(PipelineError, match="OAUTHBEARER needs one of DSH_KAFKA_SASL_OAUTH_TOKEN_FILE"):
        KafkaConfig.from_env("k:9093", env)
    with pytest.raises(PipelineError, match="OAUTHBEARER needs one of"):
        KafkaConfig.from_env("k:9093", env | {"DSH_KAFKA_SASL_OAUTH_TOKEN_FILE": "/x", "DSH_KAFKA_SASL_OAUTH_TOKEN_COMMAND": "y"})
    config = KafkaConfig.from_env("k:9093", env | {"DSH_KAFKA_SASL_OAUTH_TOKEN_COMMAND": "token-agent print"})
    assert config.sasl_oauth_token == TokenSource("command", "token-agent print") and config.sasl_username is None
