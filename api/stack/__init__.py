"""`trainmaster up | join | status | down`: runs in the CLI process and in the supervisor it starts
(supervisor.py), never in the API or the dispatcher, which it starts as child processes."""
