"""The gang placement dashboard: where PodGroups landed, why others wait, and how the solver did."""

from .history import GroupHistory
from .routes import dashboard_blueprint

__all__ = ["GroupHistory", "dashboard_blueprint"]
