"""Retention of finished jobs' metric points and logs, and of unused code packages. Runs in the API
process, a task of the app's lifespan (api/app.py), one replica at a time."""
