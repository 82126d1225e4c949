// Package projections runs the projectors that build read state from the event
// log: each is a durable consumer with its own checkpoint that applies events in
// batches, exactly once in effect, and can be replayed from the first event.
package projections
