// Package repair brings the home feeds back to what the event log says: a
// Rebuild replays the log into a shadow keyspace version beside the live one
// and switches to it; Maintenance has the planner reconcile the materialised
// inboxes in turn.
package repair
