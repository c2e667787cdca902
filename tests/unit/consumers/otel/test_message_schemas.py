"""The exported message content against the GenAI semantic conventions'
JSON schemas for ``gen_ai.input.messages`` and ``gen_ai.output.messages``.

The schemas are vendored in ``tests/fixtures/otel-genai-schemas`` from
github.com/open-telemetry/semantic-conventions at tag v1.41.0
(commit e018fe6f91862f5ed63c082f87697cddac596784), files
``docs/gen-ai/gen-ai-input-messages.json`` and
``docs/gen-ai/gen-ai-output-messages.json`` (Apache-2.0). That is the last
release of that repository to carry them: from 1.42.0 the GenAI
conventions moved to open-telemetry/semantic-conventions-genai, and the
1.44.0 release whose attribute names the spans follow
(:data:`consumers.otel.SEMCONV_VERSION`) has no GenAI schema of its own.
"""

from __future__ import annotations

import collections
import hashlib
import json

import jsonschema

from tests.conftest import ROOT
from tests.unit.consumers.otel.test_spans import FIXTURES, LOGS, _session, _spans

SCHEMAS = ROOT / "tests" / "fixtures" / "otel-genai-schemas"
#: Each vendored schema's SHA-256, as fetched: a changed file fails here.
SHA256 = {"gen-ai-input-messages.json": "c1fddd81ea2b3cd547f74407f1267658f400f5c608772ab2fc4d9a5b3d16297f",
          "gen-ai-output-messages.json": "1de96f5387186cc9d0b8b075d82eb6240435c404de6cfc5ce7f681c7e821d68b"}


def _validator(name: str) -> jsonschema.protocols.Validator:
    data = (SCHEMAS / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == SHA256[name], f"{name} is not the file vendored"
    schema = json.loads(data)
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator_class.check_schema(schema)
    return validator_class(schema)


INPUT, OUTPUT = _validator("gen-ai-input-messages.json"), _validator("gen-ai-output-messages.json")


def test_the_exported_messages_validate_against_the_conventions_schemas():
    checked, wrong = collections.Counter(), []
    for log in LOGS[::3] + FIXTURES:
        for span in _spans(*_session(log), content=True):
            for attribute, validator in (("gen_ai.input.messages", INPUT), ("gen_ai.output.messages", OUTPUT)):
                value = span.attributes.get(attribute)
                if not isinstance(value, str) or value.endswith(" more characters not exported]"):
                    continue  # none, or cut at the content limit: no JSON to check
                checked[attribute] += 1
                wrong += [f"{log.name}: span {span.name} (dsh.seq {span.attributes['dsh.seq']}): {attribute} at "
                          f"{list(error.path)}: {error.message}" for error in validator.iter_errors(json.loads(value))]
    assert not wrong, "\n".join(wrong[:10])
    assert checked["gen_ai.input.messages"] > 50 and checked["gen_ai.output.messages"] > 50, checked


def test_a_message_off_the_schema_is_refused():
    """The check can fail: an output message without its finish reason, a
    part without its type."""
    assert not OUTPUT.is_valid([{"role": "assistant", "parts": [{"type": "text", "content": "hi"}]}])
    assert not INPUT.is_valid([{"role": "user", "parts": [{"content": "hi"}]}])
    assert INPUT.is_valid([{"role": "user", "parts": [{"type": "text", "content": "hi"}]}])
