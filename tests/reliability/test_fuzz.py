"""Case 7: fuzzed job specs get 201 or 422, never a 500; schemathesis finds no 500 and no answer
that breaks the OpenAPI schema."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import ApiProcess
from tests.factories.http import bearer

json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=True) | st.text(max_size=40)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)

resources = st.dictionaries(
    st.sampled_from(["CPU", "GPU", "memory", "TPU", "", "x" * 70]),
    st.floats(allow_nan=True, allow_infinity=True) | st.integers(-5, 10) | st.text(max_size=3),
    max_size=3,
)
scaling = st.fixed_dictionaries(
    {},
    optional={
        "num_workers": st.integers(-3, 2000) | st.text(max_size=3) | st.floats(),
        "use_gpu": st.booleans() | st.integers(0, 2),
        "resources_per_worker": resources | json_values,
        "placement_strategy": st.sampled_from(["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD", "pack", "X"]),
        "extra": json_values,
    },
)
specs = st.fixed_dictionaries(
    {
        "name": st.text(max_size=140),
        "entrypoint": st.sampled_from(["builtin:mlp", "script:train.py", "pkg.mod:fn", "bad entry", "", "builtin:"])
        | st.text(max_size=20),
    },
    optional={
        "scaling": scaling | json_values,
        "config": json_values,
        "args": st.lists(st.text(max_size=10) | st.integers(), max_size=3),
        "env": st.dictionaries(st.text(max_size=8), st.text(max_size=8) | st.integers(), max_size=3),
        "labels": st.dictionaries(st.text(max_size=70), st.text(max_size=8) | st.integers(), max_size=3),
        "priority": st.integers(-200, 200),
        "max_retries": st.integers(-2, 20),
        "timeout_s": st.floats(allow_nan=True, allow_infinity=True) | st.integers(-5, 5),
        "backend": st.sampled_from(["auto", "nccl", "gloo", "mpi"]),
        "checkpoint": st.fixed_dictionaries({}, optional={"num_to_keep": st.integers(-2, 5)}) | json_values,
        "code": st.text(max_size=80),
        "unknown_field": json_values,
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=specs)
def test_fuzzed_specs_are_201_or_422(app_client: TestClient, tokens: dict[str, str], body: dict[str, Any]) -> None:
    text = json.dumps(body, allow_nan=True)
    response = app_client.post(
        "/v1/jobs", content=text, headers={**bearer(tokens["alpha"]), "Content-Type": "application/json"}
    )
    assert response.status_code in (201, 422), (response.status_code, response.text, text)
    if response.status_code == 422:
        assert response.json()["error"] == "ValidationError" and response.json()["detail"]


schemathesis = pytest.importorskip("schemathesis")


@schemathesis.serializer("application/zip")
def _zip_bytes(ctx: Any, value: Any) -> bytes:
    """Generated archive bodies: whatever bytes were drawn (mostly not a valid zip: a 422 is expected)."""
    return value if isinstance(value, bytes) else str(value).encode()


def test_schemathesis_finds_no_server_error_and_no_schema_violation(strict_api: ApiProcess) -> None:
    """Against a real API process, with a valid token (so requests get past auth into validation)."""
    from hypothesis import given as given_case
    from schemathesis.specs.openapi.checks import positive_data_acceptance

    schema = schemathesis.openapi.from_url(f"{strict_api.url}/openapi.json")
    failures: list[str] = []
    for operation in schema.get_all_operations():
        op = operation.ok()
        where = f"{op.method.upper()} {op.path}"

        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        @given_case(case=op.as_strategy())
        def check(case: Any) -> None:
            response = case.call(base_url=strict_api.url, headers=bearer(strict_api.token), timeout=10)
            try:
                # Every default check except positive_data_acceptance: rules JSON Schema cannot say
                # (nccl needs GPUs, a code id must exist, config under 64 KiB as JSON) are 422s by contract.
                case.validate_response(response, excluded_checks=[positive_data_acceptance])
            except Exception as exc:  # collect, then fail once with every finding
                failures.append(f"{where}: {str(exc)[:300]}")  # noqa: B023 - check() runs before the next op

        check()
    assert not failures, "\n".join(failures[:20])
