"""Telemetry export (OpenTelemetry, the MLflow mirror). Both the API and the dispatcher start it;
only the holder of its advisory lock exports."""
