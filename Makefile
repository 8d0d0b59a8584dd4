# One command to run, one to test. See README.md.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PG_URL ?= postgres://postgres@127.0.0.1:5432/test
REDIS ?= redis://127.0.0.1:6379/0

.PHONY: install start test test-clustered bench lint
install: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

start: install          ## embedded mode on http://127.0.0.1:8000
	$(BIN)/python manage.py start

test: install           ## the whole suite (embedded unless DATABASE_URL/REDIS_URL are set)
	$(BIN)/pytest -q --durations=25

test-clustered: install ## the same suite on PostgreSQL + Redis + a real Celery worker
	DATABASE_URL=$(PG_URL) REDIS_URL=$(REDIS) $(BIN)/pytest -q --durations=25

lint: install
	$(BIN)/ruff check .
