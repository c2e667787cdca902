"""The consumer runtime every service runs on: one poll loop and checkpoint
(:mod:`.service`), per-session ordering (:mod:`.sequencing`), a bounded
session table (:mod:`.sessions`), the services' SQLite files
(:mod:`.database`), outputs and offset commits (:mod:`.outputs`), metrics
and configuration."""

from .config import ServiceConfig
from .outputs import Outputs, ProducerOutputs
from .policy import Policy
from .service import ConsumerService

__all__ = ["ConsumerService", "Outputs", "Policy", "ProducerOutputs", "ServiceConfig"]
