"""The archiver service: every session written back in dsh's own layout."""

from .service import HELD_FILE, Archive, ArchiverConfig, archiver_service

__all__ = ["Archive", "ArchiverConfig", "HELD_FILE", "archiver_service"]
