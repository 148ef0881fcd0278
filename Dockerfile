# phalanx: `phalanx serve`, `phalanx controller` (and the other subcommands) as the entrypoint.
# The build context is limited by .dockerignore to pyproject.toml, README.md and the packages.

# Build stage: the package and its dependencies into a virtual environment.
FROM python:3.11-slim AS build
WORKDIR /src
COPY . /src
RUN python -m venv /opt/phalanx \
 && /opt/phalanx/bin/pip install --no-cache-dir /src

# Runtime: the virtual environment only (no sources, no build leftovers), as a non-root user whose
# uid matches the manifests' runAsUser. The root filesystem may be mounted read-only: nothing is
# written outside /tmp (an emptyDir in the manifests).
FROM python:3.11-slim
RUN groupadd --gid 65532 phalanx \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin phalanx
COPY --from=build /opt/phalanx /opt/phalanx
# GLIBC_TUNABLES: no per-thread cache of freed chunks (serve's ~300 threads would fill theirs over
# hours and keep it resident; docs/design.md), set here so `phalanx serve` need not re-execute itself
ENV PATH=/opt/phalanx/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GLIBC_TUNABLES=glibc.malloc.tcache_count=0
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["phalanx"]
CMD ["--help"]
