"""Limits on what one job or one project writes into the shared database: metric names and points,
events, log lines, checkpoint rows, tokens. Each is a setting (api/settings.py); a write past one is
refused whole with 429 naming the limit, its value and the setting (api/errors.py LimitExceeded)."""
