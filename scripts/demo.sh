#!/usr/bin/env bash
# The main job: services up, migrate, start the service (API, forwarder, workers),
# drive payments through its HTTP API, report what reached the outbox and the
# broker, what the consumers did, and the latencies. Run by `make demo`.
#
# CHAOS=1 (`make demo CHAOS=1`) runs the API, the forwarder and the worker as
# separate processes, against a throwaway Redis of its own on a free port, and
# during the load kills -9 and restarts the forwarder and the worker and
# crashes Redis (kill -9, down ~3 s, restarted on the same port). That Redis
# runs with appendfsync always, the durability a broker must have for the
# outbox's promise to hold: every XADD it acknowledged survives the crash, as
# would entries on a replica that is promoted. (A Redis that loses its data
# loses what was forwarded and not yet consumed; the outbox cannot help that.)
# The report must still show nothing lost and nothing doubled.
#
#   PAYMENTS   payments to drive (500; CHAOS: 5000)
#   RATE       payments started per second (unpaced; CHAOS: 100, so the load
#              outlasts the chaos)
#   ROUNDS     chaos rounds (3)
#   RATE_LIMIT the API's per-key rate limit (0: off, as the demo measures
#              what one merchant can push through; production keeps it on)
set -euo pipefail
cd "$(dirname "$0")/.."

case ${CHAOS:-} in '' | 0 | no | false) CHAOS= ;; *) CHAOS=1 ;; esac
if [ -n "$CHAOS" ]; then
	PAYMENTS=${PAYMENTS:-5000}
	RATE=${RATE:-100}
else
	PAYMENTS=${PAYMENTS:-500}
	RATE=${RATE:-0}
fi
ROUNDS=${ROUNDS:-3}
export HTTP_ADDR=${HTTP_ADDR:-127.0.0.1:8080}
export RATE_LIMIT=${RATE_LIMIT:-0}
# The demo merchant's webhook endpoint listens on 127.0.0.1 over plain http:
# allowed for this local run only (production leaves it off).
export WEBHOOK_ALLOW_PRIVATE=${WEBHOOK_ALLOW_PRIVATE:-true}
BIN=bin/outflow

say() { printf 'demo: %s\n' "$*"; }

# Only what this run uses: PostgreSQL, and the broker's server (CHAOS=1 runs
# a Redis of its own; kafka needs a cluster at KAFKA_BROKERS, not started here).
services=postgres
if [ -z "$CHAOS" ]; then
	case ${OUTFLOW_BROKER:-redis} in
	redis) services="$services redis" ;;
	nats) services="$services nats" ;;
	amqp) services="$services rabbitmq" ;;
	kafka) say "OUTFLOW_BROKER=kafka: Kafka is not started here; it must answer at ${KAFKA_BROKERS:-127.0.0.1:9092}" ;;
	esac
fi
scripts/services.sh up $services
go build -o "$BIN" ./cmd/outflow
# The reference app's set is applied only when named.
"$BIN" migrate up --set outflow --set app
# The demo's admin key (stdout holds the key alone; stderr says its id): it
# creates the merchant, whose own key, from the creation's response, then
# drives the payments. Revoked when the run ends well (an interrupted run
# leaves it in this development database, named make-demo).
key_info=$(mktemp -t outflow-demo-key.XXXXXX)
OUTFLOW_API_KEY=$("$BIN" apikey create --admin --name make-demo 2>"$key_info")
export OUTFLOW_API_KEY
key_id=$(awk '/^created API key/ {print $4}' "$key_info")
rm -f "$key_info"
revoke_key() { [ -z "$key_id" ] || "$BIN" apikey revoke "$key_id" >/dev/null; }

wait_ready() { # pid log
	for _ in $(seq 1 100); do
		curl -fsS "http://$HTTP_ADDR/readyz" >/dev/null 2>&1 && return 0
		kill -0 "$1" 2>/dev/null || { cat "$2"; say "the service exited" >&2; exit 1; }
		sleep 0.1
	done
	cat "$2"
	say "the API did not answer at http://$HTTP_ADDR within 10 s" >&2
	exit 1
}

if [ -z "$CHAOS" ]; then
	log=$(mktemp -t outflow-serve.XXXXXX.log)
	"$BIN" serve --roles api,forwarder,worker 2>"$log" &
	pid=$!
	trap 'kill "$pid" 2>/dev/null || true' EXIT
	wait_ready "$pid" "$log"

	say "driving $PAYMENTS payments through http://$HTTP_ADDR"
	"$BIN" demo --payments "$PAYMENTS" --rate "$RATE"
	echo
	"$BIN" stats

	kill -TERM "$pid"
	wait "$pid" && say "service drained and stopped cleanly (log: $log)"
	trap - EXIT
	revoke_key
	exit 0
fi

# ---- CHAOS=1 ----

command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
	{ say "CHAOS=1 needs redis-server and redis-cli installed (it runs a Redis of its own, to crash)" >&2; exit 1; }

free_port() { # a port nothing listens on
	local p
	for _ in $(seq 1 50); do
		p=$((20000 + RANDOM % 20000))
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
	done
	say "no free port found" >&2
	exit 1
}

redis_dir=$(mktemp -d -t outflow-chaos-redis.XXXXXX) # its data: removed at exit
logs=$(mktemp -d -t outflow-chaos-logs.XXXXXX)       # the processes' logs: kept
redis_port=$(free_port)
export REDIS_URL="redis://127.0.0.1:$redis_port/0"

declare -A pids # name -> pid of the running api, forwarder, worker, redis
cleanup() {
	local name
	for name in "${!pids[@]}"; do kill -9 "${pids[$name]}" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$redis_dir"
}
trap cleanup EXIT

# start NAME: start one process; a restarted one gets a new instance id.
# Short lease and claim times, so that a dead instance's partitions and
# unacknowledged messages move to its successor within seconds.
start() {
	local log="$logs/$1.log"
	case $1 in
	api) "$BIN" serve --roles api 2>>"$log" & ;;
	forwarder) "$BIN" forward --takeover-after 2s --metrics-addr '' 2>>"$log" & ;;
	worker) "$BIN" worker --claim-idle 3s 2>>"$log" & ;;
	redis)
		redis-server --port "$redis_port" --bind 127.0.0.1 --dir "$redis_dir" --save '' \
			--appendonly yes --appendfsync always --logfile "$logs/redis.log" &
		;;
	esac
	pids[$1]=$!
}

crash() { # NAME: kill -9 and reap it
	kill -9 "${pids[$1]}" 2>/dev/null || true
	wait "${pids[$1]}" 2>/dev/null || true
}

redis_up() {
	for _ in $(seq 1 100); do
		[ "$(redis-cli -p "$redis_port" ping 2>/dev/null)" = PONG ] && return 0
		sleep 0.1
	done
	say "the demo's Redis did not come up on port $redis_port (see $logs/redis.log)" >&2
	exit 1
}

# check: a process that exits on its own (not killed by the chaos) is
# restarted, as a supervisor would, and counted: the report says so.
unexpected=0
check() {
	local name
	for name in forwarder worker api; do
		kill -0 "${pids[$name]}" 2>/dev/null && continue
		wait "${pids[$name]}" 2>/dev/null || true
		unexpected=$((unexpected + 1))
		say "chaos: the $name exited on its own (see $logs/$name.log); restarting it"
		start "$name"
	done
}

start redis
redis_up
start api
start forwarder
start worker
wait_ready "${pids[api]}" "$logs/api.log"

say "CHAOS: API, forwarder and worker as separate processes; Redis of its own on port $redis_port"
say "driving $PAYMENTS payments at $RATE/s through http://$HTTP_ADDR; $ROUNDS chaos rounds during the load"
"$BIN" demo --payments "$PAYMENTS" --rate "$RATE" --forward-timeout 5m &
demo_pid=$!
pids[demo]=$demo_pid

# breathe SECONDS: sleep, unless the demo has finished (it failed early).
breathe() {
	sleep "$1"
	kill -0 "$demo_pid" 2>/dev/null
}

chaos_ended=
for round in $(seq 1 "$ROUNDS"); do
	breathe 3 || break
	say "chaos $round/$ROUNDS: kill -9 forwarder (pid ${pids[forwarder]}); restarting it in 1 s"
	crash forwarder
	sleep 1
	start forwarder
	breathe 3 || break
	check
	say "chaos $round/$ROUNDS: kill -9 worker (pid ${pids[worker]}); restarting it in 1 s"
	crash worker
	sleep 1
	start worker
	breathe 3 || break
	check
	say "chaos $round/$ROUNDS: kill -9 Redis (pid ${pids[redis]}); down for 3 s"
	crash redis
	sleep 3
	start redis
	redis_up
	say "chaos $round/$ROUNDS: Redis is back"
	check
	chaos_ended=$round
done

status=0
wait "$demo_pid" || status=$?
unset "pids[demo]"
check
echo
say "chaos: ${chaos_ended:-0} of $ROUNDS rounds (forwarder, worker and Redis each killed once per round); $unexpected unexpected exits"
if [ "$status" = 0 ] && [ "${chaos_ended:-0}" != "$ROUNDS" ]; then
	say "the run ended before the chaos did, so it proves less than it should: raise PAYMENTS or lower RATE" >&2
	status=1
fi
"$BIN" stats

# A clean stop after the chaos: SIGTERM, each drains and exits 0.
for name in worker forwarder api; do
	kill -TERM "${pids[$name]}"
	if wait "${pids[$name]}"; then unset "pids[$name]"; else
		say "the $name did not stop cleanly (see $logs/$name.log)" >&2
		status=1
	fi
done
redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true
wait "${pids[redis]}" 2>/dev/null || true
unset "pids[redis]"
[ "$status" = 0 ] && say "all stopped cleanly (logs: $logs)"
revoke_key
exit "$status"
