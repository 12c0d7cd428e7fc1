#!/usr/bin/env bash
# Brings up the services Outflow needs when nothing answers at the configured
# URLs: first from locally installed binaries, as throwaway servers whose data
# lives in the git-ignored .services/ directory, else with docker compose and
# the shipped docker-compose.yml. It never touches a server that already
# answers, and starts only the services it is asked for.
#
#   scripts/services.sh up [--test] [SERVICE...]   SERVICE: postgres redis nats rabbitmq
#   scripts/services.sh down                       stop what up started
#   scripts/services.sh status [--test] [SERVICE...]
#   scripts/services.sh tools                      the binaries some tests start on their own
#   scripts/services.sh suite-postgres start       make test's own PostgreSQL: prints "DIR URL"
#   scripts/services.sh suite-postgres stop DIR    stop it and remove DIR
#
# With no SERVICE, up and status take $SERVICES, else all four (what the tests
# use). `make demo` asks for postgres and its broker's service only.
#
# Each service is looked for at its URL: DATABASE_URL, REDIS_URL, NATS_URL,
# AMQP_URL (the service's own variables, with the same defaults). With
# --test, at the tests' URLs instead: OUTFLOW_TEST_DATABASE_URL,
# OUTFLOW_TEST_REDIS_URL, OUTFLOW_TEST_NATS_URL, OUTFLOW_TEST_AMQP_URL.
#
# Running as root: PostgreSQL refuses root and runs as the postgres user, who
# may not be able to enter the clone (under /root, 0700, say). Its throwaway
# cluster then lives in a directory of its own under /var/tmp
# (OUTFLOW_PG_TMPDIR), owned by postgres and recorded in
# .services/postgres.dir; `down` stops it and removes that directory.
#
# When a service or a test binary is missing and there is no Docker engine,
# a root user with apt-get gets Debian's package installed (the project's
# scripts install what its tests need); anyone else is told what to install.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
STATE="$ROOT/.services"
ALL_SERVICES="postgres redis nats rabbitmq"

say() { printf 'services: %s\n' "$*"; }
die() { printf 'services: %s\n' "$*" >&2; exit 1; }

TEST=
urls() {
	if [ -n "$TEST" ]; then
		DATABASE_URL=${OUTFLOW_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/outflow_test?sslmode=disable}
		REDIS_URL=${OUTFLOW_TEST_REDIS_URL:-redis://127.0.0.1:6379/0}
		NATS_URL=${OUTFLOW_TEST_NATS_URL:-nats://127.0.0.1:4222}
		AMQP_URL=${OUTFLOW_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}
	else
		DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/outflow?sslmode=disable}
		REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
		NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
		AMQP_URL=${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/}
	fi
	PG_HOST=$(url_part "$DATABASE_URL" host 5432)
	PG_PORT=$(url_part "$DATABASE_URL" port 5432)
	PG_DB=$(url_part "$DATABASE_URL" db 5432)
	REDIS_HOST=$(url_part "$REDIS_URL" host 6379)
	REDIS_PORT=$(url_part "$REDIS_URL" port 6379)
	NATS_HOST=$(url_part "$NATS_URL" host 4222)
	NATS_PORT=$(url_part "$NATS_URL" port 4222)
	AMQP_HOST=$(url_part "$AMQP_URL" host 5672)
	AMQP_PORT=$(url_part "$AMQP_URL" port 5672)
}

# url_part URL host|port|db DEFAULT_PORT
url_part() {
	local rest=${1#*://}
	rest=${rest%%\?*}
	case ${rest%%/*} in *@*) rest=${rest#*@} ;; esac
	local hostport=${rest%%/*}
	local db=
	case $rest in */*) db=${rest#*/} ;; esac
	local host=${hostport%%:*} port=${hostport##*:}
	[ "$port" = "$hostport" ] && port=$3
	case $2 in host) echo "${host:-127.0.0.1}" ;; port) echo "$port" ;; db) echo "${db:-postgres}" ;; esac
}

tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

wait_for() { # name check-fn
	for _ in $(seq 1 120); do "$2" && return 0; sleep 0.5; done
	die "$1 did not come up within 60 s"
}

docker_ok() { command -v docker >/dev/null && docker compose version >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

local_host() { case $1 in 127.0.0.1 | localhost | ::1) return 0 ;; *) return 1 ;; esac; }

# apt_install PKG: Debian's package, when we are root with apt-get; else false.
apt_updated=
apt_install() {
	[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || return 1
	say "installing $1 (Debian's package)"
	if [ -z "$apt_updated" ]; then
		apt-get update -qq >/dev/null || return 1
		apt_updated=1
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
}

# compose_up SERVICE: start one service of docker-compose.yml on the port its
# URL names, and wait until its health check passes.
compose_up() {
	say "starting $1 with docker compose"
	OUTFLOW_PG_PORT=$PG_PORT OUTFLOW_REDIS_PORT=$REDIS_PORT OUTFLOW_NATS_PORT=$NATS_PORT OUTFLOW_AMQP_PORT=$AMQP_PORT \
		docker compose up -d --wait "$1"
	echo docker >"$STATE/$1.how"
}

# ---- PostgreSQL ----

pg_ready() {
	if command -v pg_isready >/dev/null; then
		pg_isready -q -h "$PG_HOST" -p "$PG_PORT" -t 2
	else
		tcp_open "$PG_HOST" "$PG_PORT"
	fi
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

# PostgreSQL refuses to run as root: run it as the postgres user if there is
# one, from / (it may not be allowed into the clone).
as_pg_user() {
	if [ "$(id -u)" = 0 ]; then
		id postgres >/dev/null 2>&1 || die "running as root and there is no 'postgres' user to run PostgreSQL as"
		(cd / && runuser -u postgres -- "$@")
	else
		"$@"
	fi
}

# pg_dir: the directory holding the throwaway cluster (data/, its log and its
# socket). Under .services/ for a normal user; as root, one of its own under
# /var/tmp owned by postgres, reused while .services/postgres.dir names it.
pg_dir() {
	if [ "$(id -u)" != 0 ]; then
		echo "$STATE/postgres"
		return
	fi
	local dir
	dir=$(cat "$STATE/postgres.dir" 2>/dev/null || true)
	if [ -z "$dir" ] || [ ! -d "$dir" ]; then
		dir=$(mktemp -d -p "${OUTFLOW_PG_TMPDIR:-/var/tmp}" outflow-postgres.XXXXXX)
		echo "$dir" >"$STATE/postgres.dir"
	fi
	chown postgres: "$dir"
	chmod 0700 "$dir"
	echo "$dir"
}

start_postgres() {
	local bindir dir
	if ! bindir=$(pg_bindir) && local_host "$PG_HOST" && ! docker_ok && apt_install postgresql; then
		# Debian's package may start a cluster of its own on 5432.
		if pg_ready; then say "PostgreSQL answers at $PG_HOST:$PG_PORT" && return; fi
		bindir=$(pg_bindir) || die "postgresql installed, but no initdb found"
	fi
	if [ -n "${bindir:-}" ] && local_host "$PG_HOST"; then
		dir=$(pg_dir)
		mkdir -p "$dir"
		if [ ! -f "$dir/data/PG_VERSION" ]; then
			say "initialising a throwaway PostgreSQL cluster in $dir/data"
			as_pg_user "$bindir/initdb" -D "$dir/data" -A trust -U postgres --encoding=UTF8 >"$STATE/initdb.log" 2>&1 ||
				die "initdb failed, see $STATE/initdb.log"
		fi
		say "starting PostgreSQL from $bindir on $PG_HOST:$PG_PORT (data in $dir/data)"
		as_pg_user "$bindir/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w start \
			-o "-p $PG_PORT -c listen_addresses=127.0.0.1 -k $dir -c fsync=on" >/dev/null ||
			die "PostgreSQL did not start, see $dir/postgres.log"
		echo local >"$STATE/postgres.how"
	elif docker_ok; then
		compose_up postgres
	else
		die "nothing answers at $PG_HOST:$PG_PORT and there is no local PostgreSQL nor Docker (a running engine and the compose plugin).
Install PostgreSQL (Debian/Ubuntu: apt-get install postgresql; macOS: brew install postgresql@15)
or Docker, or set DATABASE_URL (tests: OUTFLOW_TEST_DATABASE_URL) to a server you run."
	fi
	wait_for PostgreSQL pg_ready
}

stop_postgres() {
	local dir bindir
	[ "$(cat "$STATE/postgres.how" 2>/dev/null)" = local ] || return 0
	dir=$(cat "$STATE/postgres.dir" 2>/dev/null || echo "$STATE/postgres")
	if bindir=$(pg_bindir) && [ -f "$dir/data/postmaster.pid" ]; then
		as_pg_user "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null && say "stopped PostgreSQL"
	fi
	if [ -f "$STATE/postgres.dir" ]; then # a directory outside the clone: nobody would find it again
		case $dir in */outflow-postgres.*) rm -rf "$dir" ;; esac
		rm -f "$STATE/postgres.dir"
	fi
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

# ---- the suite's own PostgreSQL (make test) ----

# suite_pg_start: a throwaway cluster for one `make test` run, on a free
# port, in a directory of its own under ${OUTFLOW_PG_TMPDIR:-/var/tmp}
# (owned by postgres when we are root); prints "DIR URL". The shared server
# on 5432 has max_connections 100 and fsync on: three test packages at once
# ran it out of connections, and every commit waited for the disk. This one
# has max_connections 300 and fsync, full_page_writes and synchronous_commit
# off: nothing in it has to survive a crash (the tests about durability
# start servers of their own). `suite-postgres stop DIR` ends it.
suite_pg_start() {
	local bindir dir port try psql
	bindir=$(pg_bindir) || die "the suite's PostgreSQL needs initdb and pg_ctl: run scripts/services.sh tools (Debian: apt-get install postgresql)"
	psql=$(command -v psql || echo "$bindir/psql")
	dir=$(mktemp -d -p "${OUTFLOW_PG_TMPDIR:-/var/tmp}" outflow-suite-pg.XXXXXX)
	if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
	chmod 0700 "$dir"
	if ! as_pg_user "$bindir/initdb" -D "$dir/data" -A trust -U postgres --encoding=UTF8 --no-sync >"$dir/initdb.log" 2>&1; then
		cat "$dir/initdb.log" >&2
		rm -rf "$dir"
		die "initdb of the suite's PostgreSQL failed"
	fi
	for try in $(seq 1 20); do
		port=$((20000 + RANDOM % 30000))
		tcp_open 127.0.0.1 "$port" && continue
		if as_pg_user "$bindir/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 start \
			-o "-p $port -c listen_addresses=127.0.0.1 -k $dir -c max_connections=300 -c shared_buffers=128MB -c fsync=off -c full_page_writes=off -c synchronous_commit=off" >/dev/null; then
			if ! "$psql" -qX -h 127.0.0.1 -p "$port" -U postgres -d postgres -c "CREATE DATABASE outflow_test" >/dev/null; then
				suite_pg_stop "$dir"
				die "the suite's PostgreSQL: CREATE DATABASE outflow_test failed"
			fi
			echo "$dir postgres://postgres@127.0.0.1:$port/outflow_test?sslmode=disable"
			return
		fi
		# Another server may have taken the port between the check and the start.
		tail -n 3 "$dir/postgres.log" >&2 || true
	done
	rm -rf "$dir"
	die "the suite's PostgreSQL did not start on any of 20 ports (see the log above)"
}

suite_pg_stop() { # DIR, as suite_pg_start printed it
	local bindir dir=$1
	case $dir in */outflow-suite-pg.*) ;; *) die "suite-postgres stop: $dir is not a directory suite-postgres start made" ;; esac
	[ -d "$dir" ] || return 0
	if bindir=$(pg_bindir) && [ -f "$dir/data/postmaster.pid" ]; then
		as_pg_user "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null || true
	fi
	rm -rf "$dir"
}

# ---- Redis ----

redis_ready() {
	if command -v redis-cli >/dev/null; then
		[ "$(redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]
	else
		tcp_open "$REDIS_HOST" "$REDIS_PORT"
	fi
}

start_redis() {
	local dir="$STATE/redis"
	if ! command -v redis-server >/dev/null && local_host "$REDIS_HOST" && ! docker_ok; then
		apt_install redis-server || true
		if redis_ready; then say "Redis answers at $REDIS_HOST:$REDIS_PORT" && return; fi
	fi
	if command -v redis-server >/dev/null && local_host "$REDIS_HOST"; then
		mkdir -p "$dir"
		say "starting Redis on $REDIS_HOST:$REDIS_PORT (data in $dir, not persisted)"
		redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --daemonize yes --dir "$dir" \
			--save '' --appendonly no --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
		echo local >"$STATE/redis.how"
	elif docker_ok; then
		compose_up redis
	else
		die "nothing answers at $REDIS_HOST:$REDIS_PORT and there is no local redis-server nor Docker (a running engine and the compose plugin).
Install Redis (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)
or Docker, or set REDIS_URL (tests: OUTFLOW_TEST_REDIS_URL) to a server you run."
	fi
	wait_for Redis redis_ready
}

stop_redis() {
	[ "$(cat "$STATE/redis.how" 2>/dev/null)" = local ] && [ -f "$STATE/redis/redis.pid" ] || return 0
	kill "$(cat "$STATE/redis/redis.pid")" && say "stopped Redis"
}

# ---- NATS with JetStream, for the nats broker and its tests ----

nats_ready() { tcp_open "$NATS_HOST" "$NATS_PORT"; }

nats_bin() {
	command -v nats-server 2>/dev/null && return
	[ -x /usr/sbin/nats-server ] && echo /usr/sbin/nats-server
}

start_nats() {
	local dir="$STATE/nats" bin
	bin=$(nats_bin || true)
	if [ -z "$bin" ] && local_host "$NATS_HOST" && ! docker_ok && apt_install nats-server; then
		bin=$(nats_bin || true)
	fi
	if [ -n "$bin" ] && local_host "$NATS_HOST"; then
		mkdir -p "$dir"
		say "starting NATS (JetStream) on $NATS_HOST:$NATS_PORT (data in $dir)"
		"$bin" -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$dir" -P "$dir/nats.pid" -l "$dir/nats.log" </dev/null >/dev/null 2>&1 &
		echo local >"$STATE/nats.how"
	elif docker_ok; then
		compose_up nats
	else
		die "nothing answers at $NATS_HOST:$NATS_PORT and there is no local nats-server nor Docker (a running engine and the compose plugin).
Install NATS (Debian/Ubuntu: apt-get install nats-server; macOS: brew install nats-server;
any OS with Go: go install github.com/nats-io/nats-server/v2@latest)
or Docker, or set NATS_URL (tests: OUTFLOW_TEST_NATS_URL) to a server you run."
	fi
	wait_for NATS nats_ready
}

stop_nats() {
	[ "$(cat "$STATE/nats.how" 2>/dev/null)" = local ] && [ -f "$STATE/nats/nats.pid" ] || return 0
	kill "$(cat "$STATE/nats/nats.pid")" && say "stopped NATS"
}

# ---- RabbitMQ, for the amqp broker and its tests ----

amqp_ready() { tcp_open "$AMQP_HOST" "$AMQP_PORT"; }

rabbitmq_bin() {
	# Debian's /usr/sbin/rabbitmq-server re-runs itself as the rabbitmq user
	# with its state in /var/lib/rabbitmq: run the real script instead.
	[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] && echo /usr/lib/rabbitmq/bin/rabbitmq-server && return
	command -v rabbitmq-server
}

start_rabbitmq() {
	local dir="$STATE/rabbitmq" bin
	bin=$(rabbitmq_bin || true)
	if [ -z "$bin" ] && local_host "$AMQP_HOST" && ! docker_ok && apt_install rabbitmq-server; then
		# Debian's package may start a node of its own on 5672.
		if wait_amqp_briefly; then say "RabbitMQ answers at $AMQP_HOST:$AMQP_PORT" && return; fi
		bin=$(rabbitmq_bin || true)
	fi
	if [ -n "$bin" ] && local_host "$AMQP_HOST"; then
		mkdir -p "$dir"
		say "starting RabbitMQ on $AMQP_HOST:$AMQP_PORT (data in $dir)"
		HOME="$dir" RABBITMQ_NODENAME="outflow$AMQP_PORT@localhost" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
			RABBITMQ_NODE_PORT="$AMQP_PORT" RABBITMQ_DIST_PORT=$((AMQP_PORT + 20000)) \
			RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" RABBITMQ_PID_FILE="$dir/rabbitmq.pid" \
			RABBITMQ_CONFIG_FILE="$dir/rabbitmq" RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
			"$bin" </dev/null >"$dir/rabbitmq.out" 2>&1 &
		echo local >"$STATE/rabbitmq.how"
	elif docker_ok; then
		compose_up rabbitmq
	else
		die "nothing answers at $AMQP_HOST:$AMQP_PORT and there is no local rabbitmq-server nor Docker (a running engine and the compose plugin).
Install RabbitMQ (Debian/Ubuntu: apt-get install rabbitmq-server; macOS: brew install rabbitmq)
or Docker, or set AMQP_URL (tests: OUTFLOW_TEST_AMQP_URL) to a server you run."
	fi
	wait_for RabbitMQ amqp_ready
}

wait_amqp_briefly() {
	for _ in $(seq 1 20); do amqp_ready && return 0; sleep 0.5; done
	return 1
}

stop_rabbitmq() {
	[ "$(cat "$STATE/rabbitmq.how" 2>/dev/null)" = local ] && [ -f "$STATE/rabbitmq/rabbitmq.pid" ] || return 0
	kill "$(cat "$STATE/rabbitmq/rabbitmq.pid")" && say "stopped RabbitMQ"
}

# ---- the binaries some tests start servers from, on free ports of their own ----

# tools: redis-server (outage and CLI tests), nats-server (the NATS outage
# test), pgbouncer (the forwarder behind PgBouncer), PostgreSQL's initdb and
# postgres (the WAL mode's tests), chromium (the console's
# end-to-end test drives it headless). Installed when missing
# and we may (root with apt-get); else said, and the test that needs one
# fails saying how to get it.
tools() {
	local bin pkg missing=
	for bin in redis-server nats-server pgbouncer prometheus promtool chromium; do
		command -v "$bin" >/dev/null || [ -x "/usr/sbin/$bin" ] && continue
		pkg=$bin
		# promtool ships in Debian's prometheus package.
		[ "$bin" = promtool ] && pkg=prometheus
		apt_install "$pkg" && continue
		missing="$missing $bin"
	done
	# initdb and postgres: the WAL mode's tests (walrelay, events/outbox,
	# deploy/observability) start a PostgreSQL of their own with
	# wal_level=logical.
	if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null; then
		apt_install postgresql || missing="$missing initdb(postgresql)"
	fi
	[ -z "$missing" ] && return 0
	say "not installed:$missing. Tests that start their own servers need them:"
	say "  Debian/Ubuntu: apt-get install redis-server nats-server pgbouncer prometheus chromium postgresql"
	say "  macOS: brew install redis nats-server pgbouncer prometheus; brew install --cask chromium"
	say "  nats-server, any OS with Go: go install github.com/nats-io/nats-server/v2@latest (then put \$(go env GOPATH)/bin on PATH)"
}

services_arg() { # SERVICE...: check the names; none means $SERVICES, else all
	local s list=${*:-${SERVICES:-$ALL_SERVICES}}
	for s in $list; do
		case $s in postgres | redis | nats | rabbitmq) ;; *) die "unknown service '$s' (known: $ALL_SERVICES)" ;; esac
	done
	echo "$list"
}

up() {
	local s list
	list=$(services_arg "$@") || exit 1
	mkdir -p "$STATE"
	for s in $list; do
		case $s in
		postgres) if pg_ready; then say "PostgreSQL answers at $PG_HOST:$PG_PORT"; else start_postgres; fi
			create_database "$PG_DB"
			[ -n "$TEST" ] || create_database "${OUTFLOW_TEST_DB:-outflow_test}" ;;
		redis) if redis_ready; then say "Redis answers at $REDIS_HOST:$REDIS_PORT"; else start_redis; fi ;;
		nats) if nats_ready; then say "NATS answers at $NATS_HOST:$NATS_PORT"; else start_nats; fi ;;
		rabbitmq) if amqp_ready; then say "RabbitMQ answers at $AMQP_HOST:$AMQP_PORT"; else start_rabbitmq; fi ;;
		esac
	done
}

down() {
	stop_postgres
	stop_redis
	stop_nats
	stop_rabbitmq
	if grep -qs docker "$STATE"/*.how; then docker compose down -v && say "stopped docker compose services"; fi
	rm -f "$STATE"/*.how
}

status() {
	local s list
	list=$(services_arg "$@") || exit 1
	for s in $list; do
		case $s in
		postgres) if pg_ready; then say "PostgreSQL: up at $PG_HOST:$PG_PORT"; else say "PostgreSQL: down at $PG_HOST:$PG_PORT"; fi ;;
		redis) if redis_ready; then say "Redis: up at $REDIS_HOST:$REDIS_PORT"; else say "Redis: down at $REDIS_HOST:$REDIS_PORT"; fi ;;
		nats) if nats_ready; then say "NATS: up at $NATS_HOST:$NATS_PORT"; else say "NATS: down at $NATS_HOST:$NATS_PORT"; fi ;;
		rabbitmq) if amqp_ready; then say "RabbitMQ: up at $AMQP_HOST:$AMQP_PORT"; else say "RabbitMQ: down at $AMQP_HOST:$AMQP_PORT"; fi ;;
		esac
	done
}

cmd=${1:-}
shift || true
if [ "${1:-}" = --test ]; then
	TEST=1
	shift
fi
urls
case $cmd in
up) up "$@" ;;
down) down ;;
status) status "$@" ;;
tools) tools ;;
suite-postgres)
	case ${1:-} in
	start) suite_pg_start ;;
	stop) suite_pg_stop "${2:?suite-postgres stop DIR}" ;;
	*) die "usage: $0 suite-postgres start | stop DIR" ;;
	esac ;;
*) die "usage: $0 up|status [--test] [postgres redis nats rabbitmq] | down | tools | suite-postgres start|stop DIR" ;;
esac
