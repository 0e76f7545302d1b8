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
 && useradd --system --uid 7400 --home /var/lib/bloomgrid --create-home bloomgrid \
 && mkdir -p /etc/bloomgrid && chown bloomgrid:bloomgrid /var/lib/bloomgrid
COPY --from=build /stage/usr/ /usr/
COPY deploy/image/entrypoint.sh /usr/bin/bloomgrid-entrypoint
USER bloomgrid
WORKDIR /var/lib/bloomgrid
VOLUME /var/lib/bloomgrid
EXPOSE 7400 7500 7600
ENTRYPOINT ["/usr/bin/bloomgrid-entrypoint"]
CMD ["--help"]
