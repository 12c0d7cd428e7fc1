# Outflow. `make help` lists the targets.
SHELL := bash
GO    ?= go
PKGS  := ./...

.PHONY: help build services-up services-down test-services suite-services demo test test-short bench lint fmt fmt-check

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## Build bin/outflow
	$(GO) build -o bin/outflow ./cmd/outflow

# What the tests use: PostgreSQL, Redis, NATS (JetStream) and RabbitMQ. Kafka
# runs in-process (kfake); servers some tests start of their own come from
# the binaries `scripts/services.sh tools` checks (redis-server, nats-server,
# pgbouncer, prometheus/promtool for deploy/observability's test, and
# chromium for the console's browser test).
TEST_SERVICES := postgres redis nats rabbitmq
SERVICES      ?= $(TEST_SERVICES)

services-up: ## Start what does not answer yet of SERVICES (default: all the tests use; e.g. SERVICES="postgres redis")
	@scripts/services.sh up $(SERVICES)

services-down: ## Stop the services that services-up started
	@scripts/services.sh down

demo: ## The main job: services, migrate, serve, drive payments, verify, report (CHAOS=1: with crashes)
	@CHAOS='$(CHAOS)' scripts/demo.sh

# Tests write what CI keeps (the console's browser screenshots) under
# $(OUTFLOW_TEST_ARTIFACTS), git-ignored test-artifacts/ by default; run
# directly, go test puts them in a temporary directory and logs its path.
OUTFLOW_TEST_ARTIFACTS ?= $(CURDIR)/test-artifacts

# -parallel 4: the tests mostly wait (on PostgreSQL, brokers, a browser),
# and go test's default, GOMAXPROCS (2 on CI), left the machine a third
# busy. -p stays at its default, 2: three packages at once (8m58s to
# 10m42s) ran the shared PostgreSQL out of connections ("too many clients
# already") and made waits bound by time fail, and giving go test the two
# slowest packages first made them slow each other (14m43s). go vet
# runs beside the tests, not before them (9m43s); gofmt, a second, goes
# first. vet's output waits for the tests'. vet builds with -race: the
# packages it type-checks against are then the ones go test compiles (no
# file of the module depends on the race tag), instead of a second build of
# every dependency: on a cold cache (CI's) that second build cost 485
# CPU-seconds, over a quarter of what 2 cores have in the suite's 14
# minutes. Run after `go test -race`, `go vet -race` compiled nothing;
# beside it, each reuses what the other compiled first.
#
# The suite's own PostgreSQL: unless OUTFLOW_TEST_DATABASE_URL is set, the
# tests run against a throwaway cluster `scripts/services.sh suite-postgres`
# starts on a free port (max_connections 300; fsync, full_page_writes and
# synchronous_commit off, as no test on it is about durability: those start
# servers of their own) and the trap stops, whatever the tests' outcome.
# The shared server on 5432 is then neither needed nor touched. Measured
# on 2026-12-05 (2 cores, other work on the machine): the whole suite took
# 1711 s on the shared server (a cold build cache: 5.6 min before the first
# test ran; load 12-16), 706 s on the suite's own (warm cache, load 2-14),
# then 10m28s (load 4-11); one of forwarder's load tests alone 41.8 s
# against 16.9 s. -p 3 did not help: 818 s (load 6-27), each package slower
# for sharing the CPU (handlers 250 s against 193 s at -p 2); nor
# -parallel 8 (forwarder alone, quiet: 52.5 s against 53.4 s at 4). The
# suite is bound by the two cores: in the 10m28s run it used 492 CPU-s and
# its PostgreSQL 536, of the 1,143 the machine was busy. handlers alone:
# 87 CPU-s of PostgreSQL's against 61 of the test binary's and its
# servers', and 41 of the 64 s PostgreSQL's statements ran were the DDL of
# its 56 test schemas (pg_stat_statements). Quiet, one migrated app schema
# costs PostgreSQL 0.37 CPU-s to create and drop; a database cloned from a
# migrated template (CREATE DATABASE ... STRATEGY FILE_COPY) 0.22.
#
# TEST_P and TEST_PARALLEL are go test's -p and -parallel; TESTFLAGS adds
# flags of go test's own (-json, -run, -v).
TEST_P        ?= 2
TEST_PARALLEL ?= 4
test: suite-services fmt-check ## Every test, with the race detector, against real services (screenshots in test-artifacts/)
	@mkdir -p '$(OUTFLOW_TEST_ARTIFACTS)'; \
	if [ -z "$$OUTFLOW_TEST_DATABASE_URL" ]; then \
		pg=$$(scripts/services.sh suite-postgres start) || exit 1; \
		trap 'scripts/services.sh suite-postgres stop "$${pg%% *}"' EXIT; trap 'exit 130' INT TERM; \
		export OUTFLOW_TEST_DATABASE_URL=$${pg#* }; echo "the suite's PostgreSQL: $$OUTFLOW_TEST_DATABASE_URL"; \
	fi; \
	$(GO) vet -race $(PKGS) > '$(OUTFLOW_TEST_ARTIFACTS)/vet.log' 2>&1 & vet=$$!; \
	OUTFLOW_TEST_ARTIFACTS='$(OUTFLOW_TEST_ARTIFACTS)' $(GO) test -race -count=1 -p $(TEST_P) -parallel $(TEST_PARALLEL) -timeout 15m $(TESTFLAGS) $(PKGS); rc=$$?; \
	if wait $$vet; then echo "go vet: clean"; else echo "go vet:"; cat '$(OUTFLOW_TEST_ARTIFACTS)/vet.log'; rc=1; fi; \
	exit $$rc

# What make test brings up: PostgreSQL only when OUTFLOW_TEST_DATABASE_URL
# names one (else the suite starts its own), and the tools.
suite-services:
	@scripts/services.sh up --test $(if $(OUTFLOW_TEST_DATABASE_URL),$(TEST_SERVICES),$(filter-out postgres,$(TEST_SERVICES)))
	@scripts/services.sh tools

# The services at the tests' URLs (OUTFLOW_TEST_*_URL), and the binaries of
# the servers some tests start themselves.
test-services: ## Bring up what make test needs, at the OUTFLOW_TEST_* URLs, and check the binaries some tests start
	@scripts/services.sh up --test $(TEST_SERVICES)
	@scripts/services.sh tools

bench: services-up ## Benchmarks, with ratios against a baseline measured in the same run
	$(GO) run ./cmd/outflow-bench pay
	$(GO) run ./cmd/outflow-bench forward
	$(GO) run ./cmd/outflow-bench pipeline -per-tx 5
	$(GO) run ./cmd/outflow-bench brokers
	$(GO) run ./cmd/outflow-bench nats-replicas
	$(GO) run ./cmd/outflow-bench history
	$(GO) run ./cmd/outflow-bench wait
	$(GO) run ./cmd/outflow-bench webhooks
	$(GO) run ./cmd/outflow-bench webhooks-scale
	$(GO) run ./cmd/outflow-bench webhooks-wal
	$(GO) run ./cmd/outflow-bench footprint
	$(GO) run ./cmd/outflow-bench tracing
	$(GO) run ./cmd/outflow-bench audit
	$(GO) run ./cmd/outflow-bench relay-wal
	$(GO) run ./cmd/outflow-bench relay-wal -rate 100 -events 1000
	$(GO) run ./cmd/outflow-bench event-cost
	$(GO) run ./cmd/outflow-bench consumer-wal
	$(GO) run ./cmd/outflow-bench wal-mode -clients 1,8,32
	$(GO) run ./cmd/outflow-bench console
	$(GO) test -run '^$$' -bench Handler -benchtime 3000x -count 3 ./idempotency

lint: fmt-check ## go vet and gofmt
	$(GO) vet $(PKGS)

fmt-check: ## gofmt -l: fails naming the files gofmt would change
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

fmt: ## gofmt -w
	gofmt -w $$(git ls-files '*.go')
