"""The session formats dsh writes, each read exactly as dsh reads it.

One package per format (:mod:`.v0`, :mod:`.v3`, :mod:`.v4`), each with a
fold that meets :class:`~.contract.SessionFold`, listed in
:data:`~.registry.FORMATS`; :func:`~.registry.open_fold` picks the fold from
the header's version, so files and consumers read every format the same
way. dsh's migration of older logs to v4 is :mod:`dsh_core.migration`.
"""

from .contract import FoldObserver, FoldOptions, Format, SessionFold, SnapshotCodec, opened_header
from .registry import FORMATS, check_generation, format_for, format_of, header_version, open_fold, read_header
from .v4.wire import WireError, messages_body

__all__ = [
    "FORMATS", "FoldObserver", "FoldOptions", "Format", "SessionFold", "SnapshotCodec", "WireError",
    "check_generation", "format_for", "format_of", "header_version", "messages_body", "open_fold", "opened_header",
    "read_header",
]
