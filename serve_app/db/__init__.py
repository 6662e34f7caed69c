"""Durable control-plane state: SQLModel tables on SQLite or PostgreSQL, migrated by alembic."""
