"""The auditor service: every model request proven rebuildable from its log."""

from .findings import Finding, lossless_problem
from .service import Audit, AuditorConfig, auditor_service
from .session import SavedSession
from .store import AuditStore
from .transactions import TransactionalOutputs

__all__ = ["Audit", "AuditStore", "AuditorConfig", "Finding", "SavedSession", "TransactionalOutputs",
           "auditor_service", "lossless_problem"]
