import pytest


@pytest.fixture
def database_url(fresh_database_url: str) -> str:
    """Each test has a migrated database of its own (copied from the session's template)."""
    return fresh_database_url
