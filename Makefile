# gpubook — the two commands a new user needs: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PG_URL ?= postgres://postgres@127.0.0.1:5432/gpubook
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt requirements-training.txt cli/pyproject.toml | sha1sum | cut -c1-12)
# Tests that need only a database run a second time on SQLite (the embedded default).
SQLITE_SELECTION := -m "not postgres and not redis and not training and not e2e"

.PHONY: install run test test-postgres test-sqlite lint bench clean chromium images registry

install: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt requirements-training.txt cli/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-training.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e ./cli  # the `gpubook` CLI
	rm -f $(VENV)/.installed-* && touch $@

# The embedded default: SQLite, the scheduler loop in a second process, the local executor.
run: install
	DEBUG=true $(BIN)/python manage.py migrate --no-input -v0
	DEBUG=true $(BIN)/python manage.py seed_demo
	@echo "gpubook on http://127.0.0.1:8000  (log in as alice / gpubook-demo; admin: admin / gpubook-demo)"
	DEBUG=true $(BIN)/python manage.py scheduler & scheduler=$$!; \
	trap 'kill $$scheduler 2>/dev/null' EXIT INT TERM; \
	DEBUG=true $(BIN)/python manage.py runserver 127.0.0.1:8000

test: install chromium registry lint test-postgres test-sqlite

# The browser tests drive Debian's Chromium (no browser download works here).
chromium:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "Install Chromium (e.g. apt-get install chromium) for the browser tests." >&2; exit 1; fi; }

# The image-pinning tests start a real OCI registry on loopback: Debian's docker-registry.
registry:
	@command -v docker-registry >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry >/dev/null; \
	  else echo "Install docker-registry (e.g. apt-get install docker-registry) for the image-pinning tests." >&2; exit 1; fi; }

lint: install
	$(BIN)/ruff check .

# PostgreSQL is where the no-overlap constraint and the concurrency tests live. On a laptop
# without it the suite says so and runs SQLite only; under CI=true its absence is a failure.
test-postgres: install
	@if pg_isready -q -d "$(PG_URL)" 2>/dev/null || $(BIN)/python -c "import psycopg,sys; psycopg.connect('$(PG_URL)'.rsplit('/',1)[0]+'/postgres', connect_timeout=3)" 2>/dev/null; then \
	  echo "== tests on PostgreSQL ($(PG_URL)) =="; \
	  DATABASE_URL="$(PG_URL)" GPUBOOK_REQUIRE_POSTGRES=1 $(BIN)/pytest -q -p no:cacheprovider; \
	elif [ "$$CI" = "true" ]; then \
	  echo "PostgreSQL is not reachable at $(PG_URL) and CI=true: failing rather than skipping." >&2; exit 1; \
	else \
	  echo "!! PostgreSQL not reachable at $(PG_URL): its tests did NOT run (see README)."; \
	fi

test-sqlite: install
	@echo "== tests on SQLite (the embedded default) =="
	DATABASE_URL="sqlite:///$(CURDIR)/var/test-gpubook.sqlite3" $(BIN)/pytest -q -p no:cacheprovider $(SQLITE_SELECTION) tests

bench: install chromium
	$(BIN)/python benchmarks/run_all.py

# The app image and the trainer images (deploy/images): needs a Docker engine; says SKIPPED
# where there is none.
images:
	bash deploy/images/build.sh

clean:
	rm -rf $(VENV) var build .pytest_cache .ruff_cache
