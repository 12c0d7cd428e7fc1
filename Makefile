# Outflow. `make help` lists the targets.
SHELL := bash
GO    ?= go
PKGS  := ./...

.PHONY: help build services-up services-down demo test test-short bench lint fmt

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

build: ## Build bin/outflow
	$(GO) build -o bin/outflow ./cmd/outflow

services-up: ## Start PostgreSQL and Redis if nothing answers at DATABASE_URL / REDIS_URL
	@scripts/services.sh up

services-down: ## Stop the services that services-up started
	@scripts/services.sh down

demo: ## The main job: services, migrate, serve, drive payments, verify, report (CHAOS=1: with crashes)
	@CHAOS='$(CHAOS)' scripts/demo.sh

test: services-up lint ## Every test, with the race detector, against real services
	$(GO) test -race -count=1 -timeout 15m $(PKGS)

bench: services-up ## Benchmarks, with ratios against a baseline measured in the same run
	$(GO) run ./cmd/outflow-bench pay
	$(GO) run ./cmd/outflow-bench forward
	$(GO) run ./cmd/outflow-bench claim-dead
	$(GO) run ./cmd/outflow-bench pipeline -per-tx 5
	$(GO) run ./cmd/outflow-bench brokers
	$(GO) run ./cmd/outflow-bench history
	$(GO) run ./cmd/outflow-bench webhooks
	$(GO) test -run '^$$' -bench Handler -benchtime 3000x -count 3 ./idempotency

lint: ## go vet and gofmt
	$(GO) vet $(PKGS)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

fmt: ## gofmt -w
	gofmt -w $$(git ls-files '*.go')
