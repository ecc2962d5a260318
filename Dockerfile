# syntax=docker/dockerfile:1
#
# Outbox Bridge image: one static binary on distroless, running as non-root.
#
#   docker build -t outbox-bridge .                      # the bridge (default target)
#   docker build --target receiver -t bridge-receiver .  # docker-compose.yml's sample receiver
#
# Both final stages are distroless/static (no shell, no libc, CA certificates
# and tzdata only) and run as uid 65532 (nonroot).

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS source
WORKDIR /src
# Static binaries: no libc to match in the final image.
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .

FROM source AS build-bridge
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath \
      -ldflags "-s -w -X github.com/outboxbridge/bridge/internal/version.Version=${VERSION}" \
      -o /out/bridge ./cmd/bridge

FROM source AS build-receiver
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags "-s -w" -o /out/receiver ./deploy/compose/receiver

FROM gcr.io/distroless/static-debian12:nonroot AS receiver
COPY --from=build-receiver /out/receiver /receiver
USER 65532:65532
EXPOSE 9000
ENTRYPOINT ["/receiver"]

# Last, so a plain `docker build` produces the bridge.
FROM gcr.io/distroless/static-debian12:nonroot AS bridge
COPY --from=build-bridge /out/bridge /bridge
USER 65532:65532
# HTTP_ADDR: /healthz, /readyz, /metrics and the admin API.
EXPOSE 8080
ENTRYPOINT ["/bridge"]
