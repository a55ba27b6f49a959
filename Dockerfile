# defrag's container image: `make image` (docs/operations.md, "The container image").
# Stage 1 builds the wheel and installs it with its dependencies into a virtual environment;
# stage 2 is the slim Python base plus that environment: no compiler, no pip cache, no source.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
# defrag/data/rules links to rules/: both go in, the wheel holds the files.
COPY pyproject.toml README.md LICENSE ./
COPY rules ./rules
COPY defrag ./defrag
# EXTRAS: the optional dependencies the image carries; `sweep` (distributed, pyarrow) lets the
# same image run a settings sweep's scheduler, workers and runner (deploy/sweep/). EXTRAS=""
# builds the daemon alone.
ARG EXTRAS=sweep
RUN python -m venv /opt/defrag \
    && /opt/defrag/bin/pip wheel --no-deps --wheel-dir /tmp/dist . \
    && wheel="$(ls /tmp/dist/defrag-*.whl)" \
    && /opt/defrag/bin/pip install "${wheel}${EXTRAS:+[$EXTRAS]}" \
    && /opt/defrag/bin/python -m pip uninstall --yes --quiet pip \
    && /opt/defrag/bin/defrag --version

FROM ${PYTHON_IMAGE}
# The source revision, shown as defrag_build_info{revision} on every process's /metrics.
ARG REVISION=unknown
LABEL org.opencontainers.image.revision="${REVISION}"
LABEL org.opencontainers.image.title="defrag" \
      org.opencontainers.image.description="Keeps GPU Kubernetes clusters unfragmented" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/defrag /opt/defrag
# Read-only root filesystem: nothing is written but to /tmp (an emptyDir in the manifests,
# --tmpfs /tmp with docker run): no bytecode files, matplotlib's cache in /tmp.
ENV PATH=/opt/defrag/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp \
    DEFRAG_REVISION=${REVISION}
# The UID and GID of the manifests' securityContext (runAsUser/runAsGroup 65532).
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["defrag"]
CMD ["--help"]
