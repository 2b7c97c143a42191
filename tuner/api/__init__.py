"""The tuner's REST API (tornado): trial reports, and the sweeps/models API of the service."""

from tuner.api.app import make_app

__all__ = ["make_app"]
