"""The trainmaster control plane, on PostgreSQL: the REST API (FastAPI, one folder per domain), the
dispatcher that admits, launches and follows jobs on Ray (dispatcher/), and the local stack behind
`trainmaster up` (stack/)."""
