"""The errors of the services' state stores (SQLite files, PostgreSQL), each a
:class:`~dsh_core.errors.PipelineError`.

::

    PipelineError (dsh_core.errors)
    └── StateStoreError           a service's state file is another kind, layout or group's, or unusable
        └── StoreLocationError    a store location whose scheme no backend of this build takes
"""

from __future__ import annotations

from dsh_core.errors import PipelineError

__all__ = ["StateStoreError", "StoreLocationError"]


class StateStoreError(PipelineError):
    """Raised when a service's state file cannot be used: another kind of
    file, another layout version, another group's or topic's, or unopenable."""


class StoreLocationError(StateStoreError):
    """Raised for a store location (``--store``) that is a URI of a scheme no
    backend of this build takes (``mysql://...``): a location is a file path
    (SQLite) or a URI of a known scheme, never a file named like a URI."""
