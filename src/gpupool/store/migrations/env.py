"""Alembic environment: migrations run on the connection the store hands over."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from gpupool.store.schema import Base

connection: Connection | None = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("gpupool migrations run through gpupool.store.migrate(), which passes a connection")
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
