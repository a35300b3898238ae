# syntax=docker/dockerfile:1
# Echelon images, built from one file:
#   docker build --target service     -t echelon:0.1.0 .              (agent, matcher, membership, router, CLI)
#   docker build --target routing-job -t echelon-routing-job:0.1.0 .  (the above + a JRE + PySpark)
# Base images are pinned by version tag; pin them by digest too for a release build
# (--build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:...).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
# PySpark's version; the routing job runs on the Spark that ships in its wheel.
ARG SPARK_VERSION=4.3.0
# Spark's Kubernetes entrypoint (driver/executor dispatch, used by the spark-operator)
# comes from the Apache Spark image of the same version.
ARG SPARK_IMAGE=spark:${SPARK_VERSION}-scala2.13-java17-ubuntu

# ---- build: a virtualenv holding echelon and its dependencies (they ship wheels). A C
# compiler here only, for echelon's compiled hot path (services/echelon/runtime/_fill.c,
# docs/performance.md); the final stages copy the built virtualenv, no build tools.
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Debian's point releases replace package versions, so the distribution pins them.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/echelon
COPY pyproject.toml setup.py README.md ./
COPY services ./services
RUN /opt/echelon/bin/pip install --no-cache-dir ".[server]" \
 && /opt/echelon/bin/python -c "import echelon.cli, echelon.v1.pubsub_pb2, echelon.runtime._fill"

# ---- build-spark: the same virtualenv plus PySpark (a pure-Python sdist with Spark's jars)
FROM build AS build-spark
ARG SPARK_VERSION
RUN /opt/echelon/bin/pip install --no-cache-dir "pyspark==${SPARK_VERSION}"

# ---- runtime base: the slim Python image and an unprivileged user, no build tools
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="echelon" \
      org.opencontainers.image.description="Echelon content-based publish/subscribe: agent, matcher, membership, router" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="Echelon"
RUN groupadd --gid 10001 echelon \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin --no-log-init echelon
ENV PATH=/opt/echelon/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
WORKDIR /tmp

# ---- service: the image of every Echelon service
FROM runtime AS service
COPY --from=build /opt/echelon /opt/echelon
USER 10001:10001
# gRPC: membership 7100, matcher 7120, router 7160, agent 7200; /metrics 1000 above.
EXPOSE 7100 7120 7160 7200 8100 8120 8160 8200
ENTRYPOINT ["echelon"]
CMD ["--help"]

# ---- spark-entrypoint: only Spark's Kubernetes entrypoint scripts are taken from it
FROM ${SPARK_IMAGE} AS spark-entrypoint

# ---- routing-job: the services' virtualenv with PySpark, a headless JRE and tini
FROM runtime AS routing-job
LABEL org.opencontainers.image.title="echelon-routing-job" \
      org.opencontainers.image.description="Echelon's Spark routing job: PySpark, a JRE, the echelon package"
# Debian's point releases replace package versions, so the distribution pins them.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless tini \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build-spark /opt/echelon /opt/echelon
COPY spark/main.py /opt/echelon/spark/main.py
COPY --from=spark-entrypoint /opt/entrypoint.sh /opt/decom.sh /opt/
ENV JAVA_HOME=/usr/lib/jvm/default-java \
    SPARK_HOME=/opt/echelon/lib/python3.11/site-packages/pyspark \
    SPARK_LOCAL_DIRS=/tmp \
    PYSPARK_PYTHON=/opt/echelon/bin/python
USER 10001:10001
# Spark's entrypoint runs `driver`/`executor` for the spark-operator and anything else
# (the CronJob's spark-submit) as given.
ENTRYPOINT ["/opt/entrypoint.sh"]
CMD ["spark-submit", "--version"]
