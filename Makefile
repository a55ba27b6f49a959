# Every target does its own set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
SHARED ?= ../shared

.PHONY: venv tools lint test test-fast demo bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# Debian's prometheus (with promtool) and prometheus-alertmanager, for the integration tests.
tools:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null \
	    || ! command -v prometheus-alertmanager >/dev/null; then \
	  echo "installing prometheus and prometheus-alertmanager (Debian packages)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    prometheus prometheus-alertmanager >/dev/null; \
	fi

lint: venv
	$(BIN)/ruff check defrag tests bench deploy
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(PY) deploy/sync.py --check

test: venv tools lint
	$(BIN)/pytest -q -n 2 --dist loadfile

test-fast: venv
	$(BIN)/pytest -q -x -m "not integration"

demo: venv
	$(BIN)/defrag demo

bench: venv
	$(PY) -m bench.run_all

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
