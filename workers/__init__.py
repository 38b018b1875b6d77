"""Only what runs inside Ray: the job's driver (and its warm launcher), the controller callbacks,
the framework launchers, built-in training templates, the collectives benchmark and system metrics.

The dispatcher that launches jobs on Ray is the control plane's (api/dispatcher/); nothing here imports api.
"""
