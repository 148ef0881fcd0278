# phalanx-scheduler: kube-scheduler v1.37.2 with phalanx's framework plugin (plugin/), the image of
# plugin mode (Helm value integration=plugin, or scheduler-config/plugin/; or the control plane's
# own kube-scheduler). Build from the repository root with BuildKit (docker build's default):
#   docker build -f phalanx-scheduler.Dockerfile -t phalanx-scheduler:0.1.0 .
# phalanx-scheduler.Dockerfile.dockerignore limits the build context to plugin/ and the build script.

# Build stage: the same build as the e2e suite's (hack/build-plugin.sh: versions pinned by
# plugin/go.mod and hack/versions.env, kube-scheduler's version stamped in, CGO off: a static binary).
FROM golang:1.26 AS build
WORKDIR /src
COPY . /src
RUN --mount=type=cache,target=/root/.cache/go-build --mount=type=cache,target=/go/pkg/mod \
    GOCACHE=/root/.cache/go-build XDG_CACHE_HOME=/out bash hack/build-plugin.sh \
 && install -D -m 0555 /out/phalanx/k8s/*/phalanx-scheduler /usr/local/bin/phalanx-scheduler

# Runtime: the static binary alone, as a non-root user whose uid matches the manifests' runAsUser.
# Nothing is written to the root filesystem (it may be mounted read-only; scratch space is the
# manifests' emptyDir at /tmp). The manifests give the command and --config.
FROM scratch
COPY --from=build /usr/local/bin/phalanx-scheduler /usr/local/bin/phalanx-scheduler
ENV PATH=/usr/local/bin
USER 65532:65532
ENTRYPOINT ["phalanx-scheduler"]
CMD ["--help"]
