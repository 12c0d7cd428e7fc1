#!/usr/bin/env bash
# What idle forwarders cost PostgreSQL: starts N `outflow forward` on an empty,
# migrated database of their own (outflow_idle_cost, created if missing), waits
# for them to settle, then reports transactions per second (pg_stat_database)
# and the CPU time of their backends (/proc, so run it on the database's
# machine) over SECONDS.
#
#   scripts/idle-cost.sh [N=1] [SECONDS=30] [OUTFLOW_BINARY=built from this tree]
#
# Needs psql; PGHOST/PGPORT/PGUSER default to 127.0.0.1, 5432, postgres.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1}
secs=${2:-30}
bin=${3:-}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
db=outflow_idle_cost
tmp=
if [ -z "$bin" ]; then
	tmp=$(mktemp -d)
	bin=$tmp/outflow
	go build -o "$bin" ./cmd/outflow
fi
url="postgres://$PGUSER@$PGHOST:$PGPORT/$db?sslmode=disable&application_name=outflow_idle_cost"
if [ -z "$(psql -d postgres -Atc "SELECT 1 FROM pg_database WHERE datname = '$db'")" ]; then
	psql -d postgres -qc "CREATE DATABASE $db"
fi
DATABASE_URL=$url "$bin" migrate up >/dev/null
q() { psql -d "$db" -Atc "$1"; }
q "UPDATE outbox_partitions SET owner = NULL, lease_until = NULL; DELETE FROM outbox_forwarders" >/dev/null
pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null || true; wait; [ -z "$tmp" ] || rm -rf "$tmp"' EXIT
for _ in $(seq 1 "$n"); do
	DATABASE_URL=$url LOG_LEVEL=warn "$bin" forward --metrics-addr "" 2>/dev/null &
	pids+=($!)
done
sleep 8 # leases taken, the poll backed off to its longest wait
cpu() { # clock ticks of the forwarders' backends
	local t=0 p s
	for p in $(q "SELECT pid FROM pg_stat_activity WHERE application_name = 'outflow_idle_cost'"); do
		s=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)
		t=$((t + s))
	done
	echo "$t"
}
xacts() { q "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '$db'"; }
x0=$(xacts) c0=$(cpu)
sleep "$secs"
x1=$(xacts) c1=$(cpu)
hz=$(getconf CLK_TCK)
echo "$n idle forwarder(s): $(((x1 - x0) / secs)) transactions/s, backend CPU $(((c1 - c0) * 1000 / hz / secs)) ms/s, over ${secs}s"
