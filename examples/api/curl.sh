#!/usr/bin/env bash
# The same with curl: submit, stream metrics over SSE until the job ends, read the result.
# Needs TRAINMASTER_API_URL and TRAINMASTER_TOKEN (after `trainmaster up`: see ~/.trainmaster/config).
set -euo pipefail
auth=(-H "Authorization: Bearer $TRAINMASTER_TOKEN")
job=$(curl -sS -X POST "$TRAINMASTER_API_URL/v1/jobs" "${auth[@]}" -H "Content-Type: application/json" \
  -d '{"name": "curl-example", "entrypoint": "builtin:mlp", "scaling": {"num_workers": 2}, "config": {"epochs": 1, "samples": 512}}')
id=$(printf '%s' "$job" | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])')
echo "submitted $id"
# Server-sent events: `event: metrics` with an id per batch, `event: end` when the job is over.
curl -sS -N "${auth[@]}" "$TRAINMASTER_API_URL/v1/jobs/$id/metrics/stream" | sed -n '/^event: end/q;/^event:/p' | sort | uniq -c
curl -sS "${auth[@]}" "$TRAINMASTER_API_URL/v1/jobs/$id" | python3 -c 'import json, sys; j = json.load(sys.stdin); print(j["status"], j["latest_metrics"])'
