"""What every wire model builds on: the request and response bases and the shared field types.

Request models (what a person sends) forbid unknown fields, so a typo never silently does nothing.
Response models ignore fields they do not know, so an older SDK keeps working against a newer server.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictStr, StringConstraints, model_validator


def not_text(value: Any) -> Any:
    # JSON 2.0 is an integer to JSON Schema, so whole floats pass; strings and booleans do not.
    if isinstance(value, str | bool):
        raise ValueError("must be a number, not a string or a boolean")
    return value


WholeNumber = Annotated[int, BeforeValidator(not_text)]
LabelKey = Annotated[StrictStr, StringConstraints(min_length=1, max_length=63)]
LabelValue = Annotated[StrictStr, StringConstraints(max_length=256)]
ResourceName = Annotated[str, StringConstraints(min_length=1, max_length=64)]


def nul_path(value: Any, path: str = "") -> str | None:
    """Where a NUL character hides in a JSON value (PostgreSQL text and JSONB cannot store it)."""
    if isinstance(value, str):
        return path or "value" if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(key, str) and "\x00" in key:
                return where
            if (found := nul_path(item, where)) is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            if (found := nul_path(item, f"{path}[{index}]")) is not None:
                return found
    return None


class RequestModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StoredRequestModel(RequestModel):
    """A request whose strings are stored: refuse NUL characters anywhere in it, naming where.

    Only on top-level bodies: the check walks the whole input, once.
    """

    @model_validator(mode="before")
    @classmethod
    def _no_nul_characters(cls, data: Any) -> Any:
        if (where := nul_path(data)) is not None:
            raise ValueError(f"{where} contains a NUL character (\\u0000), which cannot be stored")
        return data


class ResponseModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ErrorBody(ResponseModel):
    error: str
    detail: Any = None
