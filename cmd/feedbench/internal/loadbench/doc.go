// Package loadbench drives the feed service over HTTP with an open-loop mixed
// workload on a synthetic social graph and measures it end to end: command
// latency, feed freshness, feed reads, projector lag and resources, next to the
// raw Redis and JetStream limits of the same machine; it renders the result as
// a Markdown report and a PNG chart. It is the engine of the feedbench command.
package loadbench
