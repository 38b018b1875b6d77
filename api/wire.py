"""Answers encoded once.

FastAPI validates and encodes again whatever a handler returns as a model (it dumps the model, checks the
dump against `response_model`, then encodes it). The hottest handlers return `json_response(model)`
instead, pydantic's own encoder run once; their routes keep `response_model` for the OpenAPI schema.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import Response
from pydantic import BaseModel


def json_response(model: BaseModel, status_code: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(model.model_dump_json(), status_code=status_code, headers=headers, media_type="application/json")
