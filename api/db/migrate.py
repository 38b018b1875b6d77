"""Run Alembic programmatically, from a source checkout or an installed wheel."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from api.settings import async_url


def migrations_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here.parent.parent / "migrations", here.parent / "_migrations"):
        if (candidate / "env.py").exists():
            return candidate
    raise FileNotFoundError("the Alembic migrations folder is missing from this installation")


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", async_url(database_url).replace("%", "%%"))
    config.set_main_option("file_template", "%%(year)d_%%(month).2d_%%(day).2d_%%(rev)s_%%(slug)s")
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(database_url), revision)


def check(database_url: str) -> None:
    """Raise if the models and the migrations disagree (what `alembic check` does)."""
    command.check(alembic_config(database_url))
