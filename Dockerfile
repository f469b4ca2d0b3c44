# Build. The build context is filtered by .dockerignore; `.ci/docker-context.sh` rebuilds the
# crate from exactly what the COPY lines below bring in, so a file the build needs and the
# context lacks fails CI rather than the first `docker build`.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# Cargo.toml declares the `gateway` bench target; cargo refuses a manifest whose target file is
# missing, even when it builds only the binary.
COPY benches ./benches
# Embedded at compile time: the migrations (sqlx::migrate!), the admin UI's templates (askama)
# and its CSS, JS and icon (include_str!).
COPY migrations ./migrations
COPY templates ./templates
COPY static ./static
# The query macros check every query against the committed offline data (.sqlx/); the cargo
# config sets SQLX_OFFLINE, so the build needs no database.
COPY .sqlx ./.sqlx
COPY .cargo ./.cargo
RUN cargo build --release --locked --bin toolgate

# Run: the example tools need python3 and node; your own tools may need more.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 nodejs \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home /srv/toolgate toolgate
WORKDIR /srv/toolgate
COPY --from=build /src/target/release/toolgate /usr/local/bin/toolgate
COPY tools ./tools
COPY policies ./policies
# A numeric uid, so that an orchestrator can check `runAsNonRoot` without reading /etc/passwd.
USER 10001:10001
ENV TOOLGATE_BIND=0.0.0.0:8787
EXPOSE 8787
# Ready, not just alive: the database answers and the tool pool is loaded. python3 is already in
# the image for the example tools, so no HTTP client is added for this.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; port = os.environ.get('TOOLGATE_BIND', ':8787').rsplit(':', 1)[1]; urllib.request.urlopen(f'http://127.0.0.1:{port}/readyz', timeout=2)"]
ENTRYPOINT ["toolgate"]
CMD ["serve"]
