"""Once the gateway serves, what exists is frozen out of the cyclic garbage
collector's walks and its young generation is collected less often."""

from __future__ import annotations

import gc

from dsh_pipeline.service_commands import GARBAGE_THRESHOLDS, _collect_garbage_less_often


def test_the_collector_spares_what_exists_once_serving():
    before = gc.get_threshold()
    try:
        _collect_garbage_less_often()
        assert gc.get_threshold() == GARBAGE_THRESHOLDS and gc.get_freeze_count() > 0
        assert GARBAGE_THRESHOLDS[0] > before[0]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
