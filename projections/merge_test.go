package projections_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
)

func batchOf(evs ...events.Event) []events.Record {
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	out := make([]events.Record, len(evs))
	for i, ev := range evs {
		env, _ := events.NewEnvelope(fmt.Sprint(i), t0.Add(time.Duration(i)*time.Minute), ev)
		out[i] = events.Record{Envelope: env, Seq: uint64(i + 1), Event: ev}
	}
	return out
}

func TestMergeFollows(t *testing.T) {
	f := func(a, b domain.UserID) events.Event { return events.UserFollowed{FollowerID: a, FolloweeID: b} }
	u := func(a, b domain.UserID) events.Event { return events.UserUnfollowed{FollowerID: a, FolloweeID: b} }
	post := events.PostCreated{PostID: 9, UserID: 2}
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

	tests := []struct {
		name      string
		batch     []events.Record
		kept      []uint64
		restarted []uint64
		since     map[uint64]time.Time
		collapsed int
	}{
		{"one follow", batchOf(f(1, 2)), []uint64{1}, nil, map[uint64]time.Time{1: t0}, 0},
		{"follow twice keeps the first time", batchOf(f(1, 2), f(1, 2)), []uint64{2}, nil, map[uint64]time.Time{2: t0}, 1},
		{"follow, unfollow, follow restarts", batchOf(f(1, 2), u(1, 2), f(1, 2)), []uint64{3}, []uint64{3}, map[uint64]time.Time{3: t0.Add(2 * time.Minute)}, 2},
		{"follow then unfollow ends unfollowed", batchOf(f(1, 2), u(1, 2)), []uint64{2}, nil, map[uint64]time.Time{}, 1},
		{"other events keep their place", batchOf(f(1, 2), post, u(1, 2), f(3, 2)), []uint64{2, 3, 4}, nil, map[uint64]time.Time{4: t0.Add(3 * time.Minute)}, 1},
		{"pairs are independent", batchOf(f(1, 2), f(2, 1), u(1, 2)), []uint64{2, 3}, nil, map[uint64]time.Time{2: t0.Add(time.Minute)}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := projections.MergeFollows(tt.batch)
			var kept, restarted []uint64
			for _, r := range m.Records {
				kept = append(kept, r.Seq)
				if m.Restarted[r.Seq] {
					restarted = append(restarted, r.Seq)
				}
			}
			assert.Equal(t, tt.kept, kept)
			assert.Equal(t, tt.restarted, restarted)
			assert.Equal(t, tt.since, m.Since)
			assert.Equal(t, tt.collapsed, m.Collapsed)
		})
	}
}
