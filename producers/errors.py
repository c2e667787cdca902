"""The errors of the producers, each a :class:`~dsh_core.errors.PipelineError`.

::

    PipelineError (dsh_core.errors)
    ├── CheckpointFileError       the shipper's checkpoint file cannot be read, used or written
    ├── RuntimeDiedError          a dsh agent runtime exited or broke protocol mid-turn
    └── ExposedSecretError        a file of secrets other users may read or change
"""

from __future__ import annotations

from dsh_core.errors import PipelineError

__all__ = ["CheckpointFileError", "ExposedSecretError", "RuntimeDiedError"]


class CheckpointFileError(PipelineError):
    """Raised when the shipper's checkpoint file cannot be read, is not a
    checkpoint file, or cannot be written; the message names the path."""


class RuntimeDiedError(PipelineError):
    """Raised when a dsh agent runtime exits or breaks protocol mid-turn."""


class ExposedSecretError(PipelineError):
    """Raised when a file of secrets (the read API's tokens) has permissions
    for its group or others: the service refuses to start on it."""
