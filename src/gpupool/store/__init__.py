"""Persistence: SQLite in the data directory by default, PostgreSQL by URL."""
