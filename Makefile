# Every target does its own set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
SHARED ?= ../shared

# The image name and tag live in deploy/components/image/kustomization.yaml (the manifests use
# them too); override with `make image IMAGE=registry.example/defrag:dev`.
IMAGE_COMPONENT := deploy/components/image/kustomization.yaml
IMAGE ?= $(shell sed -n 's/^ *newName: *//p' $(IMAGE_COMPONENT)):$(shell sed -n 's/^ *newTag: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' $(IMAGE_COMPONENT))
# docker only where its daemon answers; else podman, else buildah.
CONTAINER ?= $(shell docker info >/dev/null 2>&1 && echo docker || command -v podman || command -v buildah)

.PHONY: venv tools lint test test-fast demo bench image image-name clean

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
	$(BIN)/hadolint Dockerfile

test: venv tools lint
	$(BIN)/pytest -q -n 2 --dist loadfile

test-fast: venv
	$(BIN)/pytest -q -x -m "not integration"

demo: venv
	$(BIN)/defrag demo

# docker/podman build, or buildah bud; see docs/operations.md for building without a daemon.
image:
	@test -n "$(CONTAINER)" || { echo "no docker, podman or buildah on PATH"; exit 1; }
	$(if $(findstring buildah,$(CONTAINER)),$(CONTAINER) bud,$(CONTAINER) build) -t $(IMAGE) .

image-name:
	@echo $(IMAGE)

bench: venv
	$(PY) -m bench.run_all

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
