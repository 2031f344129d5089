# syntax=docker/dockerfile:1
#
# The spotplane control plane: `spotplane serve` on port 8080, built with every cloud provider
# (--features clouds,otlp). docs/building.md says how to build, push and run it:
#
#   docker build -t registry.example.com/spotplane:0.1.0 .
#
# Stages: `builder` compiles the binary (release, --locked), `runtime-base` is Debian slim
# with CA certificates and the `spotplane` user, `runtime` (the default target) puts the
# binary on it. The build arguments below name the images and stages each one starts from, so
# that a build without a registry (tests/tests/image.rs) can give locally imported images
# for the builder's output and the base and still build this file's `runtime` stage.

# The Rust toolchain of rust-toolchain.toml, on the Debian release the runtime uses (glibc).
ARG RUST_IMAGE=docker.io/library/rust:1.95.0-bookworm
ARG DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
# What the runtime stage copies /usr/local/bin/spotplane from, and what it starts from.
ARG BINARY_STAGE=builder
ARG RUNTIME_BASE=runtime-base

FROM ${RUST_IMAGE} AS builder
WORKDIR /src
COPY . .
# Cargo's registry and the target folder are cached between builds (BuildKit); the binary is
# copied out of the cache mount into the stage.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p spotplane --features clouds,otlp \
    && install -D -m 0755 target/release/spotplane /usr/local/bin/spotplane

FROM ${DEBIAN_IMAGE} AS runtime-base
# CA certificates for the clouds' APIs, object storage and webhook receivers over TLS.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
# A user of its own (no login, no home beyond its data folder).
RUN groupadd --system --gid 10001 spotplane \
    && useradd --system --uid 10001 --gid spotplane --home-dir /var/lib/spotplane \
       --no-create-home --shell /usr/sbin/nologin spotplane \
    && install -d -o spotplane -g spotplane -m 0750 /var/lib/spotplane /etc/spotplane

FROM ${BINARY_STAGE} AS binary

FROM ${RUNTIME_BASE} AS runtime
COPY --from=binary /usr/local/bin/spotplane /usr/local/bin/spotplane
USER 10001:10001
# Relative paths of the embedded default (data/, file://data/objects) land here.
WORKDIR /var/lib/spotplane
# Listen on every interface of the container. An environment variable outranks a --config
# file: to move the port, set SPOTPLANE_SERVER__LISTEN (and SPOTPLANE_HEALTHCHECK_URL) instead.
ENV SPOTPLANE_SERVER__LISTEN=0.0.0.0:8080
EXPOSE 8080
# `spotplane healthcheck` asks http://127.0.0.1:8080/healthz (SPOTPLANE_HEALTHCHECK_URL).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["/usr/local/bin/spotplane", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/spotplane"]
# The Terraform modules give `serve --config /etc/spotplane/spotplane.toml`.
CMD ["serve"]
