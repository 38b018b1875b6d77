"""The trainmaster job service (FastAPI on PostgreSQL)."""
