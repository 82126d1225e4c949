// Package http serves the HTTP contract (openapi.yaml, docs/api.md) with
// Fiber: commands that append events, reads from the projections, and the
// operational endpoints.
package http
