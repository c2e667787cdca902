"""The consumer runtime every service runs on: one poll loop, rebalance
protection, state and health (:mod:`.member`), the events topic's policies
and checkpoints (:mod:`.service`), per-session ordering (:mod:`.sequencing`), a bounded
session table (:mod:`.sessions`), the services' SQLite files
(:mod:`.database`), outputs and offset commits (:mod:`.outputs`), metrics
and configuration."""

from .config import ServiceConfig
from .member import GroupMember, ServiceState
from .outputs import Outputs, ProducerOutputs
from .policy import Policy
from .service import ConsumerService

__all__ = ["ConsumerService", "GroupMember", "Outputs", "Policy", "ProducerOutputs", "ServiceConfig", "ServiceState"]
