#!/usr/bin/env bash
# The main job: services up, migrate, start the service (API, forwarder, workers),
# drive payments through its HTTP API, report what reached the outbox and the
# broker. Run by `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."

PAYMENTS=${PAYMENTS:-500}
export HTTP_ADDR=${HTTP_ADDR:-127.0.0.1:8080}
BIN=bin/outflow

scripts/services.sh up
go build -o "$BIN" ./cmd/outflow
"$BIN" migrate up

log=$(mktemp -t outflow-serve.XXXXXX.log)
"$BIN" serve --roles api,forwarder,worker 2>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true' EXIT

for _ in $(seq 1 100); do
	curl -fsS "http://$HTTP_ADDR/readyz" >/dev/null 2>&1 && break
	kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "demo: the service exited" >&2; exit 1; }
	sleep 0.1
done

echo "demo: driving $PAYMENTS payments through http://$HTTP_ADDR"
"$BIN" demo --payments "$PAYMENTS"
echo
"$BIN" stats

kill -TERM "$pid"
wait "$pid" && echo "demo: service drained and stopped cleanly (log: $log)"
trap - EXIT
