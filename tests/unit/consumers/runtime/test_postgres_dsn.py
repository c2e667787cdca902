"""A PostgreSQL DSN's password shows in no message: not in a store's
location, not in libpq's own words about a DSN it cannot parse."""

from __future__ import annotations

import subprocess
import sys

import pytest

from consumers.projector.store_reader import StoreReader
from consumers.runtime.postgres import PostgresDatabase, display_location
from consumers.runtime.errors import StateStoreError

PASSWORD = "s3cr/et@pw"


@pytest.mark.parametrize(("dsn", "shown"), [
    (f"postgresql://dsh:{PASSWORD}@127.0.0.1:5432/views", "postgresql://dsh:***@127.0.0.1:5432/views"),
    ("postgresql://dsh:s3%2Fcret@db/views?sslmode=require", "postgresql://dsh:***@db/views?sslmode=require"),
    ("postgresql://db/views?user=dsh&password=s3cret&port=5432", "postgresql://db/views?user=dsh&password=***&port=5432"),
    ("host=db password='s3 cret' dbname=views", "host=db password='***' dbname=views"),
    ("postgresql://dsh@db/views", "postgresql://dsh@db/views"),
])
def test_a_location_is_shown_without_its_password(dsn, shown):
    assert display_location(dsn) == shown


UNPARSABLE = "postgresql://dsh:s3cr et@127.0.0.1:1/views"  # libpq quotes the password it cannot parse


def test_a_store_that_cannot_parse_its_dsn_names_it_without_the_password():
    for opening in (lambda: PostgresDatabase(UNPARSABLE, "view-store", 1, []), lambda: StoreReader(UNPARSABLE)):
        with pytest.raises(StateStoreError) as raised:
            opening()
        assert "s3cr et" not in str(raised.value) and "postgresql://dsh:***@127.0.0.1:1/views" in str(raised.value)
    done = subprocess.run([sys.executable, "-m", "dsh_pipeline.cli", "sessions", "--store", UNPARSABLE],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0 and "s3cr et" not in done.stdout + done.stderr, done.stderr
    assert 'unexpected spaces found in "***"' in done.stderr
