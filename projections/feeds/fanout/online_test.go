package fanout_test

import (
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

type onlineUsers map[domain.UserID]struct{}

func (o onlineUsers) Online() map[domain.UserID]struct{} { return o }

// TestPlannerServesOnlineRecipientsFirst: an author with 300 followers, five
// of them online, posts twice and deletes a post in one batch. In each
// partition the appliers apply the online followers' work before anyone
// else's, every follower's work in log order, and the freshness metric tells
// the two apart.
func TestPlannerServesOnlineRecipientsFirst(t *testing.T) {
	t.Parallel()
	rig := newPlannerRig(t, feeds.Config{})
	ctx := t.Context()
	p := rig.planner(t)
	const author = domain.UserID(1000)
	var follows []events.Record
	for f := range domain.UserID(300) {
		follows = append(follows, events.Record{Seq: uint64(f) + 1, Event: events.UserFollowed{FollowerID: f + 1, FolloweeID: author}})
	}
	require.NoError(t, p.Apply(ctx, follows))
	rig.work(t) // the follows' merges, not looked at

	online := onlineUsers{3: {}, 77: {}, 150: {}, 199: {}, 300: {}}
	p.ServeFirst(online)
	at := time.Now()
	env := events.Envelope{OccurredAt: at}
	require.NoError(t, p.Apply(ctx, []events.Record{
		{Seq: 301, Envelope: env, Event: events.PostCreated{PostID: 5001, UserID: author}},
		{Seq: 302, Envelope: env, Event: events.PostCreated{PostID: 5002, UserID: author}},
		{Seq: 303, Envelope: env, Event: events.PostDeleted{PostID: 5001, UserID: author}},
	}))

	var (
		mu      sync.Mutex
		applied = map[int][]inbox.Item{} // by partition, in the order applied
	)
	reg := prometheus.NewRegistry()
	a := fanout.NewApplier(rig.store, rig.js, []int{0, 1, 2}, projections.NewMetrics(reg), slog.New(slog.DiscardHandler))
	a.SetBeforeApply(func(items []inbox.Item) error {
		mu.Lock()
		defer mu.Unlock()
		part := fanout.Partition(items[0].Recipient, 3)
		applied[part] = append(applied[part], items...)
		return nil
	})
	runAppliers(t, rig, a)

	for part, items := range applied {
		var want []domain.UserID
		for u := range online {
			if fanout.Partition(u, 3) == part {
				want = append(want, u)
			}
		}
		slices.Sort(want)
		// The online recipients' items come first: 3 each.
		var first []domain.UserID
		for _, it := range items[:3*len(want)] {
			if len(first) == 0 || first[len(first)-1] != it.Recipient {
				first = append(first, it.Recipient)
			}
		}
		slices.Sort(first)
		assert.Equal(t, want, first, "partition %d: online recipients first", part)
		for _, it := range items[3*len(want):] {
			assert.NotContains(t, online, it.Recipient, "partition %d", part)
		}
		// Each recipient's work in log order: push, push, remove.
		seqs := map[domain.UserID][]uint64{}
		for _, it := range items {
			seqs[it.Recipient] = append(seqs[it.Recipient], it.Seq)
		}
		for u, s := range seqs {
			assert.Equal(t, []uint64{301, 302, 303}, s, "recipient %d", u)
		}
	}
	total := 0
	for _, items := range applied {
		total += len(items)
	}
	assert.Equal(t, 900, total)

	counts := map[string]uint64{}
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "feed_inbox_freshness_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			counts[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
		}
	}
	// The online followers' work in messages of their own, of five items at
	// most, as the others'.
	var on, off uint64
	for part := range 3 {
		n := 0
		for u := range online {
			if fanout.Partition(u, 3) == part {
				n += 3
			}
		}
		on += uint64((n + 4) / 5)
		off += uint64((len(applied[part]) - n + 4) / 5)
	}
	assert.Equal(t, map[string]uint64{"online": on, "offline": off}, counts)
}
