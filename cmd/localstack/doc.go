// Package localstack starts the service's dependencies on loopback — a NATS
// JetStream server (embedded in this process, or run by this binary as a child
// process) and Redis and PostgreSQL child processes from local binaries — for
// development mode and for tests.
package localstack
