package http

import (
	"testing"

	"github.com/feedproject/feed/projections/feeds"
)

// TestFeedInvariantsOnARedisCluster runs the feed model on a Redis Cluster
// of three masters and three replicas: the planner and appliers' fan-out,
// follows, unfollows, deletes, Redis lost mid-run (FLUSHALL on every master),
// paging compared with the pull feed, and a maintenance pass through the
// round queue that repairs nothing.
func TestFeedInvariantsOnARedisCluster(t *testing.T) {
	w, _ := newClusterFeedWorld(t, feeds.Config{InboxCap: 20, SegmentSize: 3, OutboxCap: 20, BigThreshold: 8})
	runModelIn(t, w, 800, 3)
}
