# One image for every bloomgrid program: the first argument picks it.
#   docker build -t bloomgrid .
#   docker run bloomgrid node --listen 0.0.0.0:7400 --insecure ...
#   docker run bloomgrid router --topology /etc/bloomgrid/topology.ini ...
#   docker run bloomgrid merger --config /etc/bloomgrid/merger.ini
#   docker run -i bloomgrid bloomgrid query /data/users.bf alice
# BASE is any Debian 12 image; where no registry serves one, import a
# debootstrap'ed root first (deploy/image/README.md) and pass its name.
ARG BASE=debian:12

FROM ${BASE} AS build
# The image has no .git: pass --build-arg DESCRIBE=$(git describe --always --dirty).
ARG DESCRIBE=
WORKDIR /src
COPY deploy/install-deps.sh deploy/install-deps.sh
RUN ./deploy/install-deps.sh build && rm -rf /var/lib/apt/lists/*
COPY . .
RUN rm -rf build build-asan run \
 && cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
          -DBLOOMGRID_TESTS=OFF "-DBLOOMGRID_DESCRIBE=${DESCRIBE}" >/dev/null \
 && cmake --build build -j"$(nproc)" \
 && DESTDIR=/stage cmake --install build

FROM ${BASE}
COPY deploy/install-deps.sh /usr/share/bloomgrid/install-deps.sh
RUN /usr/share/bloomgrid/install-deps.sh runtime && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 7400 bloomgrid \
 && useradd --system --uid 7400 --gid 7400 --home /var/lib/bloomgrid --create-home bloomgrid \
 && mkdir -p /etc/bloomgrid && chown bloomgrid:bloomgrid /var/lib/bloomgrid
COPY --from=build /stage/usr/ /usr/
COPY deploy/image/entrypoint.sh /usr/bin/bloomgrid-entrypoint
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 7400:7400
WORKDIR /var/lib/bloomgrid
VOLUME /var/lib/bloomgrid
# The ports of the example settings (deploy/examples) and the Kubernetes
# manifests (deploy/kubernetes/config.yaml): public, internal, health, metrics.
#   node    7400 7401 7402 9400
#   router  7500      7502 9500
#   merger  7600      7602 9600
EXPOSE 7400 7401 7402 9400 7500 7502 9500 7600 7602 9600
# bloomgrid health on the server's health_listen (its listen without one):
# liveness, SERVING while a copy is SYNCING (deploy/image/README.md).
# Kubernetes ignores it and runs its own probes (deploy/kubernetes).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["/usr/bin/bloomgrid-entrypoint", "healthcheck"]
ENTRYPOINT ["/usr/bin/bloomgrid-entrypoint"]
CMD ["--help"]
