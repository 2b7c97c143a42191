"""The OpenAPI document the service serves at ``api/v1/openapi.json``."""

from __future__ import annotations

from typing import Any

from tornado.web import RequestHandler

_ERROR = {"$ref": "#/components/schemas/Error"}


def _op(summary: str, ok: Any, scope: str, body: Any = None, status: str = "200") -> dict:
    op: dict[str, Any] = {
        "summary": summary,
        "security": [{"hubToken": [scope]}],
        "responses": {
            status: {"description": "OK", "content": {"application/json": {"schema": ok}}},
            "400": {
                "description": "Bad request",
                "content": {"application/json": {"schema": _ERROR}},
            },
            "401": {
                "description": "No credentials",
                "content": {"application/json": {"schema": _ERROR}},
            },
            "403": {
                "description": "Missing scope",
                "content": {"application/json": {"schema": _ERROR}},
            },
            "404": {
                "description": "Not found (or not yours)",
                "content": {"application/json": {"schema": _ERROR}},
            },
        },
    }
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def _path_param(name: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "integer"}}


def document(base_path: str) -> dict[str, Any]:
    ref = lambda name: {"$ref": f"#/components/schemas/{name}"}  # noqa: E731
    sweep_id, number = _path_param("sweep_id"), _path_param("number")
    name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
    version = _path_param("version")
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "tunehub tuner API",
            "version": "1",
            "description": "Sweeps, trials and models. Authenticate with a JupyterHub token "
            "(Authorization: token ...) carrying custom:tuner:read / custom:tuner:submit.",
        },
        "servers": [{"url": base_path.rstrip("/") + "/api/v1"}],
        "paths": {
            "/sweeps": {
                "get": _op(
                    "Your sweeps", {"type": "array", "items": ref("Sweep")}, "custom:tuner:read"
                ),
                "post": _op(
                    "Submit a sweep",
                    ref("Sweep"),
                    "custom:tuner:submit",
                    ref("SweepRequest"),
                    "201",
                ),
            },
            "/sweeps/{sweep_id}": {
                "parameters": [sweep_id],
                "get": _op("A sweep", ref("Sweep"), "custom:tuner:read"),
            },
            "/sweeps/{sweep_id}/cancel": {
                "parameters": [sweep_id],
                "post": _op("Cancel a sweep", ref("Sweep"), "custom:tuner:submit"),
            },
            "/sweeps/{sweep_id}/resume": {
                "parameters": [sweep_id],
                "post": _op("Resume a sweep", ref("Sweep"), "custom:tuner:submit"),
            },
            "/sweeps/{sweep_id}/trials": {
                "parameters": [sweep_id],
                "get": _op(
                    "Trials with intermediate values",
                    {"type": "array", "items": ref("Trial")},
                    "custom:tuner:read",
                ),
            },
            "/sweeps/{sweep_id}/trials/{number}/logs": {
                "parameters": [sweep_id, number],
                "get": {
                    "summary": "A trial's output, all attempts",
                    "security": [{"hubToken": ["custom:tuner:read"]}],
                    "responses": {
                        "200": {
                            "description": "log text",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                        "404": {"description": "Not found"},
                    },
                },
            },
            "/models": {
                "get": _op(
                    "Registered models",
                    {"type": "array", "items": ref("Model")},
                    "custom:tuner:read",
                ),
            },
            "/models/{name}": {
                "parameters": [name],
                "get": _op(
                    "A model's versions",
                    {"type": "array", "items": ref("ModelVersion")},
                    "custom:tuner:read",
                ),
            },
            "/models/{name}/versions/{version}/promote": {
                "parameters": [name, version],
                "post": _op(
                    "Move a stage to a version",
                    ref("ModelVersion"),
                    "custom:tuner:submit",
                    ref("PromoteRequest"),
                ),
            },
            "/trials/{trial_id}/report": {
                "parameters": [_path_param("trial_id")],
                "post": {
                    "summary": "A trial reports its metric (per-trial token only)",
                    "security": [{"trialToken": []}],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": ref("Report")}},
                    },
                    "responses": {
                        "200": {
                            "description": "the pruning decision",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {"prune": {"type": "boolean"}},
                                    }
                                }
                            },
                        },
                        "401": {"description": "not this trial's token"},
                    },
                },
            },
        },
        "components": {
            "securitySchemes": {
                "hubToken": {"type": "apiKey", "in": "header", "name": "Authorization"},
                "trialToken": {"type": "http", "scheme": "bearer"},
            },
            "schemas": {
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
                        "spec": {"type": "object", "description": "the sweep spec (DESIGN.md)"},
                        "backend": {"type": "string", "enum": ["local", "kubernetes"]},
                        "function": {
                            "type": "string",
                            "description": "base64 cloudpickle of "
                            "a callable(params) -> float, instead of spec.command",
                        },
                    },
                },
                "Sweep": {
                    "type": "object",
                    "properties": {
                        k: {"type": t}
                        for k, t in {
                            "id": "integer",
                            "name": "string",
                            "owner": "string",
                            "state": "string",
                            "reason": "string",
                            "metric": "string",
                            "direction": "string",
                            "trials": "integer",
                            "completed": "integer",
                            "pruned": "integer",
                            "failed": "integer",
                            "best_value": "number",
                            "best_trial": "integer",
                            "cold_start": "string",
                        }.items()
                    },
                },
                "Trial": {
                    "type": "object",
                    "properties": {
                        "number": {"type": "integer"},
                        "state": {"type": "string"},
                        "value": {"type": "number"},
                        "params": {"type": "object"},
                        "attempts": {"type": "integer"},
                        "reason": {"type": "string"},
                        "intermediate_values": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "step": {"type": "integer"},
                                    "value": {"type": "number"},
                                },
                            },
                        },
                    },
                },
                "Model": {"type": "object", "properties": {"name": {"type": "string"}}},
                "ModelVersion": {
                    "type": "object",
                    "properties": {
                        "model": {"type": "string"},
                        "version": {"type": "integer"},
                        "stage": {"type": "string"},
                        "metric_value": {"type": "number"},
                    },
                },
                "PromoteRequest": {
                    "type": "object",
                    "properties": {"stage": {"type": "string", "enum": ["production", "canary"]}},
                },
                "Report": {
                    "type": "object",
                    "required": ["value"],
                    "properties": {
                        "value": {"type": "number"},
                        "step": {"type": "integer", "minimum": 0},
                        "attempt": {"type": "integer"},
                        "last": {
                            "type": "boolean",
                            "description": "the trial's final step: never pruned there",
                        },
                    },
                },
            },
        },
    }


class OpenApiHandler(RequestHandler):
    def initialize(self, base_path: str) -> None:
        self.base_path = base_path

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(document(self.base_path))
