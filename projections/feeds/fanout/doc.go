// Package fanout is the home feeds' write pipeline: the Planner follows the
// event log, keeps the follow graph and the outboxes, and publishes each
// event's work for its recipients on a fan-out stream partitioned by
// recipient; the Appliers apply that work to the inboxes in log order.
package fanout
