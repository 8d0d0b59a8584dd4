# One command to run, one to test. See README.md; installing: docs/operator/installing.md.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PG_URL ?= postgres://postgres@127.0.0.1:5432/test
REDIS ?= redis://127.0.0.1:6379/0
HOST ?= 127.0.0.1
PORT ?= 8000
# The lock files (uv pip compile, hashes included): every package at one version, for this
# kind of machine, CI's and the Dockerfile's: Linux x86_64, CPython 3.11.7 or a later 3.11.
LOCK := requirements/lock.txt
RUNTIME_LOCK := requirements/runtime-lock.txt
LOCK_FOR := --python-version 3.11.7 --python-platform x86_64-unknown-linux-gnu \
	--generate-hashes --custom-compile-command 'make lock' $(if $(UPGRADE),--upgrade)
UV := $(BIN)/uv pip

.PHONY: install start test test-clustered bench lint lock docs
install: $(VENV)/.installed
# Every package at the version and sha256 the lock names (the base, every extra, the dev
# tools): uv first, its own pin taken from the lock and checked by pip, then the rest by uv;
# then the project itself, editable, resolving nothing.
$(VENV)/.installed: pyproject.toml $(LOCK)
	$(PY) -m venv $(VENV)
	awk '/^uv==/ {p = 1; print; next} p && /^ / {print; next} {p = 0}' $(LOCK) >$(VENV)/uv-pin.txt
	$(BIN)/pip install -q --require-hashes --no-deps -r $(VENV)/uv-pin.txt
	$(UV) install -q --python $(BIN)/python --require-hashes --no-deps -r $(LOCK)
	$(UV) install -q --python $(BIN)/python --no-deps -e .
	touch $@

# pyproject.toml -> the lock files, keeping every pin that still fits its bounds (UPGRADE=1:
# the newest versions those allow). The runtime lock (the Dockerfile's: no dev tools) takes
# its versions from the full one.
lock: install
	$(UV) compile -q pyproject.toml --extra dev $(LOCK_FOR) -o $(LOCK)
	$(UV) compile -q pyproject.toml --extra grpc --extra s3 --extra fast-json \
		--extra tracing --extra json-logs -c $(LOCK) \
		$(LOCK_FOR) -o $(RUNTIME_LOCK)

start: install          ## embedded mode on http://$(HOST):$(PORT) (make start PORT=8080)
	$(BIN)/python manage.py start --host $(HOST) --port $(PORT)

test: install           ## the whole suite (embedded unless DATABASE_URL/REDIS_URL are set)
	$(BIN)/pytest -q --durations=25

test-clustered: install ## the same suite on PostgreSQL + Redis + a real Celery worker
	DATABASE_URL=$(PG_URL) REDIS_URL=$(REDIS) $(BIN)/pytest -q --durations=25

lint: install
	$(BIN)/ruff check .

# (NO_MKDOCS_2_WARNING: mkdocs-material's banner about MkDocs 2 in every build's log)
docs: install           ## the documentation site into site/ (a warning fails it)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
