"""What the differential tests share: dsh 0.2.1rc2's own reader, or a skip saying why not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.oracle.extract import OracleUnavailableError, oracle_dir


@pytest.fixture(scope="module")
def oracle() -> Path:
    try:
        return oracle_dir()
    except OracleUnavailableError as error:
        pytest.skip(f"dsh 0.2.1rc2's reader cannot run here: {error}")
