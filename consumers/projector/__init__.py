"""The projector service: views of every session's model-visible conversation."""

from .service import Projection, ProjectorConfig, projector_service
from .store import ViewStore, view_head

__all__ = ["Projection", "ProjectorConfig", "ViewStore", "projector_service", "view_head"]
