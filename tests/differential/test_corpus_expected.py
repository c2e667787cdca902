"""The corpus's expected outputs regenerate, unchanged, from the pinned reference.

``tests.corpus.regenerate`` runs the published dsh packages pinned in
``tools/reference/package.json`` over every corpus log; each committed
``NAME.expected.json`` must equal what they print, field by field, as
canonical JSON.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import CORPUS, corpus_logs
from tests.corpus.regenerate import FOLDERS, ReferenceUnavailableError, differences, main, reference_node, regenerate

pytestmark = pytest.mark.reference

# An accepted log that crash repair changes: a torn final line is dropped and a closer appended.
REPAIRED = "truncated-final-line--examples-acp-agent-tests-snapshots-hook-codex-stop-continue"


@pytest.fixture(scope="module")
def reference() -> None:
    try:
        reference_node()
    except ReferenceUnavailableError as error:
        pytest.skip(f"the pinned reference cannot run here: {error}")


@pytest.fixture(scope="module")
def regenerated(reference) -> dict[Path, dict]:
    return regenerate(corpus_logs(*FOLDERS))


def test_every_expected_json_regenerates_unchanged(regenerated):
    failing = {log.name: fields for log, expected in regenerated.items() if (fields := differences(log, expected))}
    assert failing == {}
    assert len(regenerated) == len(list(CORPUS.glob("dsh-*/*.expected.json")))


def test_the_script_writes_the_committed_bytes_and_its_check_names_a_changed_field(reference, tmp_path, capsys):
    source = CORPUS / "dsh-negative" / f"{REPAIRED}.jsonl"
    log = Path(shutil.copy(source, tmp_path))
    written = tmp_path / f"{REPAIRED}.expected.json"

    assert main([str(log)]) == 0
    assert written.read_bytes() == source.with_name(written.name).read_bytes()

    changed = json.loads(written.read_text("utf-8"))
    changed["repair"]["closers"][0]["data"]["reason"] = {"kind": "completed"}
    written.write_text(json.dumps(changed), "utf-8")
    capsys.readouterr()
    assert main(["--check", str(log)]) == 1
    assert capsys.readouterr().out.splitlines() == [f"{written}: differs in repair", "0 of 1 expected.json files match"]
