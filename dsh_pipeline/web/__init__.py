"""The read API and the transcript viewer (``dsh-pipeline serve``)."""

from .app import read_api

__all__ = ["read_api"]
