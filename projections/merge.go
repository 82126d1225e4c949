package projections

import (
	"time"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

// FollowPair is one (follower, followee) relation.
type FollowPair struct {
	Follower, Followee domain.UserID
}

// Merged is a batch with its follow and unfollow events merged per pair.
type Merged struct {
	// Records is the batch in log order, with each pair's follow events reduced to
	// the pair's last one, kept at its own position.
	Records []events.Record
	// Restarted holds the sequences of kept follows preceded in the batch by an
	// unfollow of the same pair: the relation ended and began again, so a follow
	// of a pair that is already followed is not a no-op then.
	Restarted map[uint64]bool
	// Since holds, for each kept follow, when its run of follows began: the first
	// follow after the pair's last unfollow in the batch (following again changes
	// nothing, so that first one is when the relation began).
	Since map[uint64]time.Time
	// Collapsed counts the events dropped because a later one of the same pair
	// supersedes them.
	Collapsed int
}

// MergeFollows collapses the follow/unfollow events of each pair in a batch to
// the last one. Placing it at the last one's position keeps every other event's
// view of the relation unchanged: before it, the pair's state is what it was
// before the batch or what the earlier, dropped events would have made it, and a
// projector that applies "follow" by merging in the followee's posts and
// "unfollow" by removing them ends in the same state either way.
func MergeFollows(batch []events.Record) Merged {
	last := map[FollowPair]int{}
	for i, rec := range batch {
		if pair, _, ok := followOf(rec); ok {
			last[pair] = i
		}
	}
	out := Merged{Records: make([]events.Record, 0, len(batch)), Restarted: map[uint64]bool{}, Since: map[uint64]time.Time{}}
	type run struct {
		since      time.Time
		following  bool // in a run of follows
		unfollowed bool // the batch unfollowed the pair before the run
	}
	runs := map[FollowPair]*run{}
	for i, rec := range batch {
		pair, follow, ok := followOf(rec)
		if !ok {
			out.Records = append(out.Records, rec)
			continue
		}
		r := runs[pair]
		if r == nil {
			r = &run{}
			runs[pair] = r
		}
		if follow && !r.following {
			r.since, r.following = rec.OccurredAt, true
		}
		if !follow {
			r.following, r.unfollowed = false, true
		}
		if last[pair] != i {
			out.Collapsed++
			continue
		}
		if follow {
			out.Since[rec.Seq] = r.since
			if r.unfollowed {
				out.Restarted[rec.Seq] = true
			}
		}
		out.Records = append(out.Records, rec)
	}
	return out
}

// followOf tells whether rec is a follow or unfollow, and of which pair.
func followOf(rec events.Record) (FollowPair, bool, bool) {
	switch e := rec.Event.(type) {
	case events.UserFollowed:
		return FollowPair{e.FollowerID, e.FolloweeID}, true, true
	case events.UserUnfollowed:
		return FollowPair{e.FollowerID, e.FolloweeID}, false, true
	}
	return FollowPair{}, false, false
}
