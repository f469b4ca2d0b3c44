# Build
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY migrations ./migrations
COPY templates ./templates
RUN cargo build --release --locked

# Run: the example tools need python3 and node; your own tools may need more.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates python3 nodejs \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home /srv/toolgate toolgate
WORKDIR /srv/toolgate
COPY --from=build /src/target/release/toolgate /usr/local/bin/toolgate
COPY tools ./tools
COPY policies ./policies
COPY static ./static
USER toolgate
ENV TOOLGATE_BIND=0.0.0.0:8787
EXPOSE 8787
ENTRYPOINT ["toolgate"]
CMD ["serve"]
