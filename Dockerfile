# syntax=docker/dockerfile:1
# The server and agent images, from one build ( docs/deploy.md#images ):
#   docker build --target server -t gpuledger-server .
#   docker build --target agent  -t gpuledger-agent .
# Both run as a non-root user on distroless (glibc, CA certificates, nothing else). The binaries
# carry their templates, assets and migrations; NVML is the driver's, loaded at run time.

ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --no-default-features -p gpuledger-server -p gpuledger-agent \
 && mkdir -p /out/data \
 && cp target/release/gpuledger-server target/release/gpuledger-agent /out/

FROM gcr.io/distroless/cc-debian12:nonroot AS server
COPY --from=build /out/gpuledger-server /usr/bin/gpuledger-server
# SQLite's file when no PostgreSQL URL is given: mount a volume here.
COPY --from=build --chown=65532:65532 /out/data /var/lib/gpuledger
ENV GPULEDGER_LISTEN=0.0.0.0:8080 \
    GPULEDGER_DATABASE_URL=sqlite:///var/lib/gpuledger/gpuledger.db
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/bin/gpuledger-server"]
CMD ["serve"]

FROM gcr.io/distroless/cc-debian12:nonroot AS agent
COPY --from=build /out/gpuledger-agent /usr/bin/gpuledger-agent
# The NVIDIA container runtime mounts the driver's libnvidia-ml.so into a container that asks for
# it so: every GPU visible, the utility (NVML) libraries only, no GPU claimed.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
USER 65532:65532
ENTRYPOINT ["/usr/bin/gpuledger-agent"]
CMD ["run"]
