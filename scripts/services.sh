#!/usr/bin/env bash
# Brings up the services Outflow needs (PostgreSQL, Redis, NATS, RabbitMQ) when nothing
# answers at the configured URLs: first from locally installed binaries, in
# the git-ignored .services/ directory, else with docker compose. It never
# touches a server that already answers.
#
#   scripts/services.sh up | down | status
#
# Reads DATABASE_URL (default postgres://postgres@127.0.0.1:5432/outflow) and
# REDIS_URL (default redis://127.0.0.1:6379/0).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
STATE="$ROOT/.services"
DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/outflow?sslmode=disable}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}

say() { printf 'services: %s\n' "$*"; }
die() { printf 'services: %s\n' "$*" >&2; exit 1; }

# url_part URL host|port|db DEFAULT_PORT
url_part() {
	local rest=${1#*://}
	rest=${rest#*@}
	local hostport=${rest%%/*}
	local db=${rest#*/}
	db=${db%%\?*}
	local host=${hostport%%:*} port=${hostport##*:}
	[ "$port" = "$hostport" ] && port=$3
	case $2 in host) echo "${host:-127.0.0.1}" ;; port) echo "$port" ;; db) echo "$db" ;; esac
}

PG_HOST=$(url_part "$DATABASE_URL" host 5432)
PG_PORT=$(url_part "$DATABASE_URL" port 5432)
PG_DB=$(url_part "$DATABASE_URL" db 5432)
REDIS_HOST=$(url_part "$REDIS_URL" host 6379)
REDIS_PORT=$(url_part "$REDIS_URL" port 6379)

tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

pg_ready() {
	if command -v pg_isready >/dev/null; then
		pg_isready -q -h "$PG_HOST" -p "$PG_PORT" -t 2
	else
		tcp_open "$PG_HOST" "$PG_PORT"
	fi
}

redis_ready() {
	if command -v redis-cli >/dev/null; then
		[ "$(redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]
	else
		tcp_open "$REDIS_HOST" "$REDIS_PORT"
	fi
}

# NATS with JetStream, for the nats broker and its tests (host:port only).
NATS_HOST=${NATS_HOST:-127.0.0.1}
NATS_PORT=${NATS_PORT:-4222}
nats_ready() { tcp_open "$NATS_HOST" "$NATS_PORT"; }

start_nats() {
	local dir="$STATE/nats"
	if command -v nats-server >/dev/null && local_host "$NATS_HOST"; then
		mkdir -p "$dir"
		say "starting NATS (JetStream) on $NATS_HOST:$NATS_PORT (data in $dir)"
		nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$dir" -P "$dir/nats.pid" -l "$dir/nats.log" &
		echo local >"$STATE/nats.how"
	elif docker_ok; then
		say "starting NATS with docker compose"
		docker compose up -d nats
		echo docker >"$STATE/nats.how"
	else
		die "nothing answers at $NATS_HOST:$NATS_PORT and there is no local nats-server nor a running Docker engine.
Install NATS (Debian/Ubuntu: apt-get install nats-server; macOS: brew install nats-server)
or Docker, or set OUTFLOW_TEST_NATS_URL / NATS_URL to a server you run."
	fi
	wait_for NATS nats_ready
}

# RabbitMQ, for the amqp broker and its tests (host:port only).
AMQP_HOST=${AMQP_HOST:-127.0.0.1}
AMQP_PORT=${AMQP_PORT:-5672}
amqp_ready() { tcp_open "$AMQP_HOST" "$AMQP_PORT"; }

start_rabbitmq() {
	local dir="$STATE/rabbitmq" bin
	# Debian's /usr/sbin/rabbitmq-server re-runs itself as the rabbitmq user
	# with its state in /var/lib/rabbitmq: run the real script instead.
	bin=/usr/lib/rabbitmq/bin/rabbitmq-server
	[ -x "$bin" ] || bin=$(command -v rabbitmq-server || true)
	if [ -n "$bin" ] && local_host "$AMQP_HOST"; then
		mkdir -p "$dir"
		say "starting RabbitMQ on $AMQP_HOST:$AMQP_PORT (data in $dir)"
		HOME="$dir" RABBITMQ_NODENAME="outflow$AMQP_PORT@localhost" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
			RABBITMQ_NODE_PORT="$AMQP_PORT" RABBITMQ_DIST_PORT=$((AMQP_PORT + 20000)) \
			RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" RABBITMQ_PID_FILE="$dir/rabbitmq.pid" \
			RABBITMQ_CONFIG_FILE="$dir/rabbitmq" RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
			"$bin" >"$dir/rabbitmq.out" 2>&1 &
		echo local >"$STATE/rabbitmq.how"
	elif docker_ok; then
		say "starting RabbitMQ with docker compose"
		docker compose up -d rabbitmq
		echo docker >"$STATE/rabbitmq.how"
	else
		die "nothing answers at $AMQP_HOST:$AMQP_PORT and there is no local rabbitmq-server nor a running Docker engine.
Install RabbitMQ (Debian/Ubuntu: apt-get install rabbitmq-server; macOS: brew install rabbitmq)
or Docker, or set OUTFLOW_TEST_AMQP_URL / AMQP_URL to a server you run."
	fi
	wait_for RabbitMQ amqp_ready
}

wait_for() { # name check-fn
	for _ in $(seq 1 60); do "$2" && return 0; sleep 0.5; done
	die "$1 did not come up within 30 s"
}

pg_bindir() {
	if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
		dirname "$(command -v pg_ctl)"
		return
	fi
	local d
	for d in /usr/lib/postgresql/*/bin; do
		[ -x "$d/initdb" ] && { echo "$d"; return; }
	done
	return 1
}

docker_ok() { command -v docker >/dev/null && docker info >/dev/null 2>&1; }

local_host() { case $1 in 127.0.0.1 | localhost | ::1) return 0 ;; *) return 1 ;; esac; }

# PostgreSQL refuses to run as root: run it as the postgres user if there is one.
as_pg_user() {
	if [ "$(id -u)" = 0 ]; then
		id postgres >/dev/null 2>&1 || die "running as root and there is no 'postgres' user to run PostgreSQL as"
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

start_postgres() {
	local bindir dir="$STATE/postgres"
	if bindir=$(pg_bindir) && local_host "$PG_HOST"; then
		mkdir -p "$dir"
		[ "$(id -u)" = 0 ] && chown postgres "$dir" "$STATE" 2>/dev/null || true
		if [ ! -f "$dir/data/PG_VERSION" ]; then
			say "initialising a throwaway PostgreSQL cluster in $dir/data"
			as_pg_user "$bindir/initdb" -D "$dir/data" -A trust -U postgres --encoding=UTF8 >"$dir/initdb.log" 2>&1 ||
				die "initdb failed, see $dir/initdb.log"
		fi
		say "starting PostgreSQL from $bindir on $PG_HOST:$PG_PORT"
		as_pg_user "$bindir/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w start \
			-o "-p $PG_PORT -c listen_addresses=127.0.0.1 -k $dir -c fsync=on" >/dev/null ||
			die "PostgreSQL did not start, see $dir/postgres.log"
		echo local >"$STATE/postgres.how"
	elif docker_ok; then
		say "starting PostgreSQL with docker compose"
		docker compose up -d postgres
		echo docker >"$STATE/postgres.how"
	else
		die "nothing answers at $PG_HOST:$PG_PORT and there is no local PostgreSQL nor a running Docker engine.
Install PostgreSQL (Debian/Ubuntu: apt-get install postgresql; macOS: brew install postgresql@15)
or Docker, or set DATABASE_URL to a server you run."
	fi
	wait_for PostgreSQL pg_ready
}

start_redis() {
	local dir="$STATE/redis"
	if command -v redis-server >/dev/null && local_host "$REDIS_HOST"; then
		mkdir -p "$dir"
		say "starting Redis on $REDIS_HOST:$REDIS_PORT (data in $dir, not persisted)"
		redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --daemonize yes --dir "$dir" \
			--save '' --appendonly no --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
		echo local >"$STATE/redis.how"
	elif docker_ok; then
		say "starting Redis with docker compose"
		docker compose up -d redis
		echo docker >"$STATE/redis.how"
	else
		die "nothing answers at $REDIS_HOST:$REDIS_PORT and there is no local redis-server nor a running Docker engine.
Install Redis (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)
or Docker, or set REDIS_URL to a server you run."
	fi
	wait_for Redis redis_ready
}

create_database() { # name
	local sql="SELECT 1 FROM pg_database WHERE datname = '$1'"
	local admin="postgres://postgres@$PG_HOST:$PG_PORT/postgres?sslmode=disable"
	if command -v psql >/dev/null; then
		if [ -z "$(psql "$admin" -Atqc "$sql")" ]; then
			psql "$admin" -qc "CREATE DATABASE \"$1\"" && say "created database $1"
		fi
	elif [ "$(cat "$STATE/postgres.how" 2>/dev/null)" = docker ]; then
		if [ -z "$(docker compose exec -T postgres psql -U postgres -Atqc "$sql")" ]; then
			docker compose exec -T postgres psql -U postgres -qc "CREATE DATABASE \"$1\"" && say "created database $1"
		fi
	else
		say "psql is not installed: create database $1 yourself if it is missing"
	fi
}

# PgBouncer: not a service to keep running, a binary the tests start on a
# free port of their own (transaction pooling). Installed here when missing
# and we may; else the test that needs it says how.
ensure_pgbouncer() {
	if command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ]; then return 0; fi
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		say "installing pgbouncer (Debian's package) for the tests"
		apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null ||
			say "could not install pgbouncer; the PgBouncer test will say how"
	else
		say "pgbouncer is not installed: the PgBouncer test needs it (apt-get install pgbouncer; brew install pgbouncer)"
	fi
}

up() {
	mkdir -p "$STATE"
	ensure_pgbouncer
	if pg_ready; then say "PostgreSQL answers at $PG_HOST:$PG_PORT"; else start_postgres; fi
	if redis_ready; then say "Redis answers at $REDIS_HOST:$REDIS_PORT"; else start_redis; fi
	if nats_ready; then say "NATS answers at $NATS_HOST:$NATS_PORT"; else start_nats; fi
	if amqp_ready; then say "RabbitMQ answers at $AMQP_HOST:$AMQP_PORT"; else start_rabbitmq; fi
	create_database "$PG_DB"
	create_database "${OUTFLOW_TEST_DB:-outflow_test}"
}

down() {
	if [ "$(cat "$STATE/postgres.how" 2>/dev/null)" = local ]; then
		local bindir
		bindir=$(pg_bindir)
		as_pg_user "$bindir/pg_ctl" -D "$STATE/postgres/data" -m fast stop >/dev/null && say "stopped PostgreSQL"
	fi
	if [ "$(cat "$STATE/redis.how" 2>/dev/null)" = local ] && [ -f "$STATE/redis/redis.pid" ]; then
		kill "$(cat "$STATE/redis/redis.pid")" && say "stopped Redis"
	fi
	if [ "$(cat "$STATE/nats.how" 2>/dev/null)" = local ] && [ -f "$STATE/nats/nats.pid" ]; then
		kill "$(cat "$STATE/nats/nats.pid")" && say "stopped NATS"
	fi
	if [ "$(cat "$STATE/rabbitmq.how" 2>/dev/null)" = local ] && [ -f "$STATE/rabbitmq/rabbitmq.pid" ]; then
		kill "$(cat "$STATE/rabbitmq/rabbitmq.pid")" && say "stopped RabbitMQ"
	fi
	if grep -qs docker "$STATE"/*.how; then docker compose down && say "stopped docker compose services"; fi
	rm -f "$STATE"/*.how
}

status() {
	if pg_ready; then say "PostgreSQL: up at $PG_HOST:$PG_PORT"; else say "PostgreSQL: down at $PG_HOST:$PG_PORT"; fi
	if redis_ready; then say "Redis: up at $REDIS_HOST:$REDIS_PORT"; else say "Redis: down at $REDIS_HOST:$REDIS_PORT"; fi
	if nats_ready; then say "NATS: up at $NATS_HOST:$NATS_PORT"; else say "NATS: down at $NATS_HOST:$NATS_PORT"; fi
	if amqp_ready; then say "RabbitMQ: up at $AMQP_HOST:$AMQP_PORT"; else say "RabbitMQ: down at $AMQP_HOST:$AMQP_PORT"; fi
}

case ${1:-} in
up) up ;;
down) down ;;
status) status ;;
*) die "usage: $0 up|down|status" ;;
esac
