"""The OpenAPI document the service serves at ``api/v1/openapi.json``.

It is the contract schemathesis checks the running service against (tests/test_api_fuzz.py):
every status a route can answer is listed, and every schema says which fields may be ``null``.
Keep it in step with :mod:`tuner.serialize` (the JSON views) and the handlers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tornado.web import RequestHandler

from tunehub_base.outage import REQUEST_KEY
from tunehub_base.scopes import READ, SUBMIT
from tuner.api.base import MAX_ID
from tuner.backends import BACKENDS
from tuner.lifecycle.states import SweepState, TrialState
from tuner.serving.registry import ARCHIVED, STAGES

_ERROR = {"$ref": "#/components/schemas/Error"}
_WHY = {
    "400": "Bad request: the body names the field (field) and what was expected",
    "401": "No or unknown credentials",
    "403": "The token lacks the scope this route needs",
    "404": "No such object, or not yours (the same answer)",
    "409": "Not possible in the object's current state",
    "413": "The body is larger than TUNEHUB_API_MAX_BODY (field: body); none of it was kept",
    "503": "The cluster (Kubernetes backend) cannot be reached; nothing was stored",
}


def _errors(*codes: str) -> dict[str, Any]:
    return {
        code: {"description": _WHY[code], "content": {"application/json": {"schema": _ERROR}}}
        for code in codes
    }


def _op(
    summary: str,
    ok: Any,
    scope: str,
    body: Any = None,
    status: str = "200",
    errors: tuple[str, ...] = ("401", "403", "404"),
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "security": [{"hubToken": [scope]}],
        "responses": {
            status: {"description": "OK", "content": {"application/json": {"schema": ok}}},
            **_errors(*errors),
        },
    }
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def _id_param(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_ID},
    }


def _nullable(kind: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "nullable": True, **extra}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": sorted(properties), "properties": properties}


def _one_of(values: Iterable[str]) -> dict[str, Any]:
    """A string that is one of ``values`` (a state enum's members, the backends' names)."""
    return {"type": "string", "enum": [str(v) for v in values]}


_TIME = _nullable("string", format="date-time")

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["status", "error"],
        "properties": {
            "status": {"type": "integer"},
            "error": {"type": "string"},
            "field": {"type": "string"},
        },
    },
    "SweepRequest": {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "spec": {"type": "object", "description": "the sweep spec (README, DESIGN.md)"},
            "backend": _one_of(BACKENDS),
            "function": {
                "type": "string",
                "description": "base64 cloudpickle of a callable(params) -> float, instead of "
                "spec.command",
            },
        },
    },
    "Sweep": _object({
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "owner": {"type": "string"},
        "state": _one_of(SweepState),
        "reason": _nullable("string"),
        "backend": {"type": "string"},
        "metric": _nullable("string"),
        "direction": _nullable("string"),
        "trials": _nullable("integer"),
        "parallelism": _nullable("integer"),
        TrialState.COMPLETED: {"type": "integer"},
        TrialState.PRUNED: {"type": "integer"},
        TrialState.FAILED: {"type": "integer"},
        "best_value": _nullable("number"),
        "best_trial": _nullable("integer"),
        "model_version_id": _nullable("integer"),
        "cold_start": _nullable("string"),
        "created_at": _TIME,
        "started_at": _TIME,
        "finished_at": _TIME,
        "spec": {"type": "object"},
    }),
    "Trial": _object({
        "number": {"type": "integer"},
        "state": _one_of(TrialState),
        "value": _nullable("number"),
        "params": {"type": "object"},
        "attempts": {"type": "integer"},
        "preemptions": {"type": "integer"},
        "reason": _nullable("string"),
        "last_step": _nullable("integer"),
        "has_model": {"type": "boolean"},
        # Every metric of its final report and the serving figures tunehub measured.
        "metrics": _nullable("object"),
        "started_at": _TIME,
        "finished_at": _TIME,
        "duration_seconds": _nullable("number"),
        # Measured GPU use on this machine (README "Measured GPU use"); null: no GPU held here.
        "gpu_use": _nullable("object"),
        "intermediate_values": {
            "type": "array",
            "items": _object({"step": {"type": "integer"}, "value": {"type": "number"}}),
        },
    }),
    "Model": {
        "type": "object",
        "required": ["name", "owner", "versions", "latest", "production", "canary", "metric"],
        "properties": {
            "name": {"type": "string"},
            "owner": {"type": "string"},
            "versions": {"type": "integer"},
            "latest": _nullable("integer"),
            "production": _nullable("integer"),
            "canary": _nullable("integer"),
            "production_value": _nullable("number"),
            "canary_value": _nullable("number"),
            "metric": {"type": "string"},
        },
    },
    "ModelVersion": _object({
        "model": {"type": "string"},
        "version": {"type": "integer"},
        "owner": {"type": "string"},
        "stage": _nullable("string", enum=[*STAGES, ARCHIVED, None]),
        "path": {"type": "string"},
        "metric": {"type": "string"},
        "direction": {"type": "string"},
        "metric_value": _nullable("number"),
        "sweep_id": _nullable("integer"),
        "trial_number": _nullable("integer"),
        "params": {"type": "object"},
        "code_location": _nullable("string"),
        "data_path": _nullable("string"),
        "metrics": _nullable("object"),
        "history": {"type": "array", "items": {"type": "object"}},
        "code_digest": _nullable("string"),
        "created_at": _TIME,
        "promoted_at": _TIME,
    }),
    "PromoteRequest": {
        "type": "object",
        "properties": {"stage": _one_of(STAGES)},
    },
    "Report": {
        "type": "object",
        "description": "value (with step: an intermediate one), metrics (a final report of "
                       "several metrics), or steps (several intermediate values, in order)",
        "properties": {
            "value": {"type": "number"},
            "steps": {"type": "array", "minItems": 1, "maxItems": 1000, "items": {
                "type": "object", "required": ["step", "value"], "properties": {
                    "step": {"type": "integer", "minimum": 0, "maximum": MAX_ID},
                    "value": {"type": "number"}}}},
            "metrics": {"type": "object", "additionalProperties": {"type": "number"},
                        "minProperties": 1, "maxProperties": 32},
            "step": {"type": "integer", "minimum": 0, "maximum": MAX_ID},
            "attempt": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
            "last": {
                "type": "boolean",
                "description": "the trial's final step: never pruned there",
            },
        },
    },
    "GpuUseReport": {
        "type": "object",
        "required": ["readings"],
        "properties": {
            "attempt": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
            "readings": {"type": "array", "minItems": 1, "maxItems": 16, "items": {
                "type": "object", "required": ["gpu"], "properties": {
                    "gpu": {"type": "string", "minLength": 1, "maxLength": 64},
                    "utilization": _nullable("number", minimum=0, maximum=1),
                    "memory_used_bytes": _nullable("integer", minimum=0),
                    "memory_total_bytes": _nullable("integer", minimum=0),
                    "pids": {"type": "array", "maxItems": 256,
                             "items": {"type": "integer", "minimum": 0}},
                    "absent": _nullable("string", maxLength=300),
                    "name": _nullable("string", maxLength=300),
                }}},
        },
    },
}


def document(base_path: str) -> dict[str, Any]:
    ref = lambda name: {"$ref": f"#/components/schemas/{name}"}  # noqa: E731
    sweep_id, number = _id_param("sweep_id"), _id_param("number")
    name = {
        "name": "name",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": "^[a-z0-9]([a-z0-9-]{0,46}[a-z0-9])?$"},
    }
    version = _id_param("version")
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "tunehub tuner API",
            "version": "1",
            "description": "Sweeps, trials and models. Authenticate with a JupyterHub token "
            "(Authorization: token ...) carrying custom:tuner:read / custom:tuner:submit. "
            "Another user's sweep or model answers 404, as one that does not exist.",
        },
        "servers": [{"url": base_path.rstrip("/") + "/api/v1"}],
        "paths": {
            "/sweeps": {
                "get": _op("Your sweeps", {"type": "array", "items": ref("Sweep")}, READ,
                           errors=("401", "403")),
                "post": {**_op(
                    "Submit a sweep (priority: high needs custom:tuner:priority-high); the "
                    "same Idempotency-Key again answers the sweep it made",
                    ref("Sweep"), SUBMIT, ref("SweepRequest"), "201",
                    errors=("400", "401", "403", "413", "503"),
                ), "parameters": [{
                    "name": REQUEST_KEY, "in": "header", "required": False,
                    "schema": {"type": "string", "minLength": 1, "maxLength": 64},
                }]},
            },
            "/sweeps/{sweep_id}": {
                "parameters": [sweep_id],
                "get": _op("A sweep", ref("Sweep"), READ),
            },
            "/sweeps/{sweep_id}/cancel": {
                "parameters": [sweep_id],
                "post": _op("Cancel a sweep (idempotent: a cancelled sweep is answered as it "
                            "is; one that ended otherwise is a 409)", ref("Sweep"), SUBMIT,
                            errors=("401", "403", "404", "409")),
            },
            "/sweeps/{sweep_id}/resume": {
                "parameters": [sweep_id],
                "post": _op("Resume a sweep", ref("Sweep"), SUBMIT,
                            errors=("401", "403", "404", "409")),
            },
            "/sweeps/{sweep_id}/trials": {
                "parameters": [sweep_id],
                "get": _op("Trials with intermediate values",
                           {"type": "array", "items": ref("Trial")}, READ),
            },
            "/sweeps/{sweep_id}/trials/{number}/logs": {
                "parameters": [sweep_id, number],
                "get": {
                    "summary": "A trial's output, all attempts",
                    "security": [{"hubToken": [READ]}],
                    "responses": {
                        "200": {
                            "description": "log text",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                        **_errors("401", "403", "404"),
                    },
                },
            },
            "/models": {
                "get": _op("Registered models", {"type": "array", "items": ref("Model")},
                           READ, errors=("401", "403")),
            },
            "/models/{name}": {
                "parameters": [name],
                "get": _op("A model's versions", {"type": "array", "items": ref("ModelVersion")},
                           READ),
            },
            "/models/{name}/versions/{version}/promote": {
                "parameters": [name, version],
                "post": _op("Move a stage to a version", ref("ModelVersion"), SUBMIT,
                            ref("PromoteRequest"), errors=("400", "401", "403", "404")),
            },
            "/pool": {
                "get": _op("This machine's GPUs: free, or who holds each since when, and what each "
                           "does (utilisation, memory); the queue with positions and reasons; each "
                           "person's share (everyone's). On Kubernetes (mode kubernetes): the "
                           "pods holding GPUs, each Kueue flavor's quota and use (flavors), the "
                           "pending GPU Workloads with Kueue's positions and reasons",
                           {"type": "object"}, READ, errors=("401", "403")),
            },
            "/usage": {
                "parameters": [{"name": "since", "in": "query", "required": True,
                                "schema": {"type": "string", "example": "2026-11-01"}}],
                "get": _op("Allocated and used GPU-hours per person, group, sweep and notebook",
                           {"type": "object"}, READ, errors=("400", "401", "403")),
            },
            "/trials/{trial_id}/report": {
                "parameters": [_id_param("trial_id")],
                "post": {
                    "summary": "A trial reports its metric (its running attempt's token only)",
                    "security": [{"trialToken": []}],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": ref("Report")}},
                    },
                    "responses": {
                        "200": {
                            "description": "the pruning decision",
                            "content": {"application/json": {"schema": {
                                "type": "object", "required": ["batch_seconds", "prune"],
                                "properties": {
                                "prune": {"type": "boolean"},
                                "step": {"type": "integer", "description":
                                         "of a batch: the step the trial is pruned at"},
                                "batch_seconds": {"type": "number", "description":
                                                  "how long the trial may hold intermediate "
                                                  "values to send them together"}}}}},
                        },
                        # 401 for any report no running attempt takes, whichever the
                        # reason (tuner.api.trials.refused); 404 only for a path that is no
                        # route at all (an empty trial id).
                        **_errors("400", "401", "404", "413"),
                    },
                },
            },
            "/trials/{trial_id}/gpu-use": {
                "parameters": [_id_param("trial_id")],
                "post": {
                    "summary": "A Kubernetes trial pod's reading of its own GPUs (its running "
                               "attempt's token only)",
                    "security": [{"trialToken": []}],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": ref("GpuUseReport")}},
                    },
                    "responses": {
                        "200": {
                            "description": "the GPUs of the attempt measured as unused so far",
                            "content": {"application/json": {"schema": _object(
                                {"unused": {"type": "array", "items": {"type": "string"}}})}},
                        },
                        **_errors("400", "401", "404", "413"),
                    },
                },
            },
        },
        "components": {
            "securitySchemes": {
                "hubToken": {"type": "apiKey", "in": "header", "name": "Authorization"},
                "trialToken": {"type": "http", "scheme": "bearer"},
            },
            "schemas": SCHEMAS,
        },
    }


class OpenApiHandler(RequestHandler):
    def initialize(self, base_path: str) -> None:
        self.base_path = base_path

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(document(self.base_path))
