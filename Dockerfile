# syntax=docker/dockerfile:1
#
# The idemgate gateway in a container.
#
#   docker build -t idemgate .
#   docker run --rm -p 8080:8080 -p 9464:9464 -v idemgate-data:/var/lib/idemgate \
#     -e IDEMGATE_UPSTREAM=https://api.openai.com -e IDEMGATE_ADMIN_TOKEN=… idemgate
#
# Proxy on 8080, admin (/metrics, /healthz, /readyz, dashboard) on 9464; both
# listen on 0.0.0.0 inside the container, so the gateway refuses to start
# without IDEMGATE_ADMIN_TOKEN (an admin listener other machines can reach
# needs its token). The default store is an SQLite file
# in the volume /var/lib/idemgate. Configure with IDEMGATE_* variables, or
# mount a TOML file and add `--config /etc/idemgate/idemgate.toml` to the
# command. Flags win over the file and the environment, so the listen
# addresses and the store below are changed by overriding the command.
#
# Stopping drains in-flight upstream calls for up to `shutdown_grace` (30s by
# default): give the container longer than that (`docker stop -t 40`,
# compose `stop_grace_period`), or Docker kills it after 10s and the calls
# still running are cut (their keys expire after pending_ttl).

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# The registry and target caches need BuildKit (the default builder of
# Docker 23+ and of compose); the binary leaves the cache by `install`.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release -p idemgate --locked \
 && install -D -m 0755 target/release/idemgate /out/idemgate

FROM debian:bookworm-slim
# ca-certificates: HTTPS upstreams are verified against the system roots.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 idemgate \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/idemgate \
      --no-create-home --shell /usr/sbin/nologin idemgate \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/idemgate
COPY --from=builder /out/idemgate /usr/local/bin/idemgate

USER 10001:10001
WORKDIR /var/lib/idemgate
VOLUME ["/var/lib/idemgate"]
EXPOSE 8080 9464

# /healthz answers 200 while the process serves (liveness: it never asks the
# store, so a store outage does not restart the container). The slim image
# has no curl or wget; bash's /dev/tcp sends the request, so no HTTP client
# is installed for it. It probes 127.0.0.1:9464: keep the admin listener on
# that port, or override the health check with the command.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9464 && printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && IFS= read -r -t 4 status <&3 && [[ $status == 'HTTP/1.'?' 200 '* ]]"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["idemgate"]
CMD ["serve", "--listen", "0.0.0.0:8080", "--admin-listen", "0.0.0.0:9464", "--store", "sqlite:/var/lib/idemgate/idemgate.db"]
