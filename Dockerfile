# The feed binary in a small image: `docker compose` builds it for every
# service that runs feed (compose.yaml).
#
#   docker build -t feed .
#   docker run --rm feed help

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so that a change of the code alone reuses their layer.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Static, so that it runs on an image without a C library; the build
# context holds no .git, so there is no VCS information to stamp.
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false -o /out/feed ./cmd/feed \
 && mkdir -p /out/data

# Certificates, time zones, /tmp and a non-root user; no shell.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/feed /usr/local/bin/feed
# FEED_DATA_DIR, owned by the user feed runs as: a volume mounted here
# starts with this owner.
COPY --from=build --chown=nonroot:nonroot /out/data /data
ENV FEED_DATA_DIR=/data FEED_HTTP_ADDR=:8080
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/feed"]
CMD ["serve"]
