# The dsh-pipeline image: one entry point, every service a subcommand.
# It runs as an unprivileged user whose uid/gid match the owner of the bind
# mounts (./sessions, ./archive) on the host: build with --build-arg UID=…
FROM python:3.11-slim
ARG UID=1000
ARG GID=1000
RUN groupadd --gid "$GID" dsh && useradd --uid "$UID" --gid "$GID" --no-create-home dsh \
    && mkdir -p /state /data /archive && chown dsh:dsh /state /data /archive
WORKDIR /app
# .dockerignore lets in only the project and its packages.
COPY . .
RUN pip install --no-cache-dir . && rm -rf /app
WORKDIR /
USER dsh
ENTRYPOINT ["dsh-pipeline"]
