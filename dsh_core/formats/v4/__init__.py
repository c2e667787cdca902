"""The session formats dsh writes after v0: v4 (dsh 0.2.x) and v3 (dsh 0.1.5),
read exactly as dsh 0.2.1 reads them.

A v4 log is read by :class:`~dsh_core.v4.load.V4Fold`, a v3 log by
:class:`~dsh_core.v4.v3.V3Fold` (v3 migrated to v4 in memory, as dsh does);
:func:`dsh_core.folds.open_fold` picks the fold from the header's version, so
files and consumers read every format the same way. :func:`~dsh_core.v4.wire.messages_body`
rebuilds the Messages request dsh sends at a boundary.

Adding the next format: a header reader and a fold with ``header_value``,
``event_line``, ``apply``, ``finish``, ``header``, ``state``, ``count``,
``error`` and ``idle``, its version added to :mod:`dsh_core.folds`, and its
releases' real logs with dsh's own reading of them under ``tests/fixtures``.
"""

from .load import V4_VERSIONS, V4Fold
from .v3 import V3Fold
from .wire import messages_body

__all__ = ["V3Fold", "V4Fold", "V4_VERSIONS", "messages_body"]
