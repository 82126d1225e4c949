// Package localstack starts the service's dependencies on loopback — an embedded
// NATS JetStream server and Redis and PostgreSQL child processes from local
// binaries — for development mode and for tests.
package localstack
