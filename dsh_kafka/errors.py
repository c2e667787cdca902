"""The errors of the Kafka edge, each a :class:`~dsh_core.errors.PipelineError`.

::

    PipelineError (dsh_core.errors)
    ├── DeliveryError             a record was not acknowledged by the cluster
    │   ├── RecordTooLargeError   a record over the topic's message limit, refused before sending
    │   └── DeliveryTimeoutError  not acknowledged within the delivery deadline (exit 69: waiting may help)
    ├── ClusterUnavailableError   no broker answered, or the cluster refused this client
    │   ├── BrokerAbsentError     no broker answered at all (waiting may help)
    │   └── BrokerOutageError     the cluster answered, some of its brokers did not (waiting may help)
    ├── TopicMismatchError        an existing topic is not what was asked (partitions, copies, settings)
    └── FencedError               a newer group member took this member's partition over
"""

from __future__ import annotations

from dsh_core.errors import PipelineError

__all__ = ["BrokerAbsentError", "BrokerOutageError", "ClusterUnavailableError", "DeliveryError", "DeliveryTimeoutError",
           "FencedError", "RecordTooLargeError", "TopicMismatchError"]


class DeliveryError(PipelineError):
    """Raised when a record sent to the cluster was not acknowledged; nothing
    after it is committed."""


class RecordTooLargeError(DeliveryError):
    """Raised before sending a record larger than the topic's message limit."""


class DeliveryTimeoutError(DeliveryError):
    """Raised when records sent waited longer than the delivery deadline
    (``--delivery-timeout``) for the cluster to take or acknowledge them
    (fewer copies in sync than ``min.insync.replicas``, no leader): the
    producer stops; what was acknowledged before is kept (checkpoints,
    manifests), nothing after it. Waiting for the cluster may help."""


class ClusterUnavailableError(PipelineError):
    """Raised when no broker of the bootstrap answers, or the cluster refuses
    this client (credentials, ACLs): nothing was done."""


class BrokerAbsentError(ClusterUnavailableError):
    """Raised when no broker of the bootstrap answers at all (none listens,
    the name does not resolve): unlike a refusal, waiting may help."""


class BrokerOutageError(ClusterUnavailableError):
    """Raised when the cluster took this client but some of its brokers did
    not answer until the deadline (down, paused, or fewer up than a topic's
    copies need): not a refusal; waiting may help."""


class TopicMismatchError(PipelineError):
    """Raised when a topic exists but is not what was asked: other
    partitions, fewer copies or in-sync copies, another cleanup policy,
    compression or a smaller message limit. It names the topic, what it has
    and what was asked."""


class FencedError(PipelineError):
    """Raised when a newer member of the group took one of this member's
    partitions over (its transactional id): this member stops."""
