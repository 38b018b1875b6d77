"""Operating the processes: liveness, readiness and Prometheus routes, the request-body limit (all in
the API process), and process-lifetime helpers: parent.py for the API's workers, heap.py for the API
and the dispatcher alike."""
