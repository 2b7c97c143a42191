"""Prometheus metrics of the tuner: what an operator graphs and alerts on."""

from __future__ import annotations

import tornado.web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

SWEEPS_SUBMITTED = Counter("tunehub_sweeps_submitted_total", "Sweeps submitted", ["backend"])
SWEEPS_FINISHED = Counter("tunehub_sweeps_finished_total", "Sweeps finished", ["state"])
TRIALS_LAUNCHED = Counter("tunehub_trial_attempts_launched_total", "Trial attempts launched")
TRIALS_FINISHED = Counter("tunehub_trials_finished_total", "Trials finished", ["state"])
TRIALS_RUNNING = Gauge("tunehub_trials_running", "Trial attempts running now")
TRIAL_STARTS = Counter(
    "tunehub_trial_starts_total",
    "Local trial attempts started, by warm (forked from a preloaded process) or cold",
    ["mode"],
)
REPORTS = Counter("tunehub_trial_reports_total", "Intermediate values reported by trials")
API_REQUESTS = Histogram(
    "tunehub_api_request_seconds", "Tuner API request latency", ["method", "route", "status"]
)


class MetricsHandler(tornado.web.RequestHandler):
    """Prometheus scrape endpoint of a tunehub process (no user data, no auth)."""

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest())
