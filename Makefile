# Every target does its own set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
SHARED ?= ../shared
# The reference data (the openb trace, the FGD paper's figures) that the simulator's tests and
# benchmarks read; `make data` fetches the openb files into it. The project's CI keeps a copy
# beside the checkout; anywhere else it is the user's cache, the CLI's default too. Without the
# files those tests skip with one line, except under CI=true, where a missing file is a failure.
DATA ?= $(if $(wildcard $(SHARED)/data),$(SHARED)/data,$(HOME)/.cache/defrag/data)
export DEFRAG_DATA_DIR ?= $(abspath $(DATA))
# The e2e suite's control plane (tests/e2e/): kube-apiserver, kube-controller-manager and
# kube-scheduler unpacked once from $(SHARED)/controlplane into this cache; KUBEBUILDER_ASSETS
# (envtest's convention) points the tests at it. Without the binaries the e2e tests skip.
KUBE_ASSETS ?= $(HOME)/.cache/defrag/kube-assets-v1.36.2
KUBE_COMPONENTS := kube-apiserver kube-controller-manager kube-scheduler
export KUBEBUILDER_ASSETS ?= $(shell [ -x $(KUBE_ASSETS)/kube-apiserver ] || [ -d $(SHARED)/controlplane ] && echo $(KUBE_ASSETS))

# The image name and tag live in deploy/components/image/kustomization.yaml (the manifests use
# them too); override with `make image IMAGE=registry.example/defrag:dev`.
IMAGE_COMPONENT := deploy/components/image/kustomization.yaml
IMAGE ?= $(shell sed -n 's/^ *newName: *//p' $(IMAGE_COMPONENT)):$(shell sed -n 's/^ *newTag: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' $(IMAGE_COMPONENT))
# docker only where its daemon answers; else podman, else buildah.
CONTAINER ?= $(shell docker info >/dev/null 2>&1 && echo docker || command -v podman || command -v buildah)

# The real Helm engine for the chart's tests (tests/support/helm.py): Helm v4's Go library as
# PyPI's helm-sdkpy, pinned, in its own virtualenv (a test tool, never a dependency of defrag).
# It declares Python >= 3.12 and runs on 3.11, hence --ignore-requires-python.
HELM_SDKPY_VERSION := 0.1.32
HELM_TOOLS ?= .tools/helm

.PHONY: venv tools tools-helm kube-assets data lint test test-fast e2e demo demo-note bench image image-name clean soak soak-memory

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,sweep]'
	touch $@

# Debian's prometheus (with promtool) and prometheus-alertmanager, for the integration tests;
# etcd-server for the e2e suite's control plane; libjemalloc2, an allocator an operator may
# preload (tests/test_heap.py checks that defrag names it and leaves its own trim aside).
tools:
	@if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null \
	    || ! command -v prometheus-alertmanager >/dev/null || ! command -v etcd >/dev/null \
	    || ! $$(command -v ldconfig || echo /sbin/ldconfig) -p | grep -q 'libjemalloc.so.2 '; then \
	  echo "installing prometheus, prometheus-alertmanager, etcd-server and libjemalloc2 (Debian packages)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends \
	    prometheus prometheus-alertmanager etcd-server libjemalloc2 >/dev/null; \
	fi

tools-helm: $(HELM_TOOLS)/.installed-$(HELM_SDKPY_VERSION)

$(HELM_TOOLS)/.installed-$(HELM_SDKPY_VERSION):
	rm -rf $(HELM_TOOLS)
	$(PYTHON) -m venv $(HELM_TOOLS)
	$(HELM_TOOLS)/bin/python -m pip install -q --ignore-requires-python 'helm-sdkpy==$(HELM_SDKPY_VERSION)'
	touch '$@'

# Unpack the control plane binaries from $(SHARED)/controlplane (checked against SHA256SUMS)
# once; a no-op when they are unpacked already or not there to unpack (the e2e tests skip).
kube-assets:
	@if [ -d $(SHARED)/controlplane ] && [ ! -x $(KUBE_ASSETS)/kube-scheduler ]; then \
	  echo "unpacking the control plane binaries into $(KUBE_ASSETS)"; \
	  mkdir -p $(KUBE_ASSETS).tmp && \
	  for c in $(KUBE_COMPONENTS); do \
	    xz -dc $(SHARED)/controlplane/$$c.xz > $(KUBE_ASSETS).tmp/$$c && chmod +x $(KUBE_ASSETS).tmp/$$c; \
	  done && \
	  (cd $(KUBE_ASSETS).tmp && sha256sum --quiet -c $(abspath $(SHARED))/controlplane/SHA256SUMS) && \
	  rm -rf $(KUBE_ASSETS) && mv $(KUBE_ASSETS).tmp $(KUBE_ASSETS); \
	fi

# Download the openb trace files into $(DATA)/openb, each checked against its SHA-256.
data: venv
	$(BIN)/defrag data fetch --dir $(DATA)

lint: venv
	$(BIN)/ruff check defrag tests bench deploy
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(PY) deploy/sync.py --check
	$(BIN)/hadolint Dockerfile

test: venv tools tools-helm kube-assets lint
	$(BIN)/pytest -q -rs -n 2 --dist loadfile

# The end-to-end suite alone, on the real control plane.
e2e: venv tools tools-helm kube-assets
	$(BIN)/pytest -q -rs -n 2 --dist loadfile tests/e2e

test-fast: venv
	$(BIN)/pytest -q -rs -x -m "not integration"

# On a fresh clone the venv is made first: pip shows each package as it goes (PIP_VERBOSE=1
# cancels the venv recipe's -q for this target and its prerequisites), after one line saying so.
demo: export PIP_VERBOSE = 1
demo: demo-note venv
	$(BIN)/defrag demo

demo-note:
	@test -f $(VENV)/.installed || echo "make demo: first, a virtualenv in $(VENV) with defrag and its dependencies (about 90 s; pip's progress below)"

# docker/podman build, or buildah bud; see docs/operations.md for building without a daemon.
image:
	@test -n "$(CONTAINER)" || { echo "no docker, podman or buildah on PATH"; exit 1; }
	$(if $(findstring buildah,$(CONTAINER)),$(CONTAINER) bud,$(CONTAINER) build) -t $(IMAGE) \
	  --build-arg REVISION=$(shell git rev-parse --short HEAD 2>/dev/null || echo unknown) .

image-name:
	@echo $(IMAGE)

# Every bench at HEAD and at BASE (default HEAD~1; BASE=none: HEAD only) in one run, each figure
# beside its target (docs/benchmarks.md). BENCH=a,b picks benches; QUICK=1 their small sizes.
# The table is also written to build/bench/bench.md and bench.json.
bench: venv
	$(PY) -m bench.run_all --base $(or $(BASE),HEAD~1) --out build/bench \
	  $(if $(BENCH),--only $(BENCH)) $(if $(QUICK),--quick)

clean:
	rm -rf $(VENV) .tools build *.egg-info .pytest_cache .mypy_cache .ruff_cache

# The chaos soak (bench/bench_soak.py): two daemon replicas on the real control plane under API
# faults and chaos, every invariant checked. SEED and CYCLES may be given: make soak SEED=2
soak: venv kube-assets
	$(PY) -m bench.bench_soak --seed $(or $(SEED),1) --cycles $(or $(CYCLES),1000) --json soak-$(or $(SEED),1).json

# The long memory soak (docs/daemon.md § The long memory soak): 5,000 nodes with churn, faults
# and chaos for 2 h, RSS each minute to soak-out/rss.csv, then its plot. REPLICAS=1 or 2.
soak-memory: venv kube-assets
	$(PY) -m bench.bench_soak --memory --seed $(or $(SEED),1) --nodes $(or $(NODES),5000) \
	  --pool 8 --fill-pods 4000 --cycle-interval-s 5 --max-wall-s $(or $(WALL),7800) \
	  --cycles 1000000000 --replicas $(or $(REPLICAS),2) --out soak-out --keep soak-out/keep \
	  --json soak-out/report.json
	$(PY) -m bench.soak_plot soak-out/rss.csv --out soak-out/rss.png --json soak-out/rss-figures.json
