package fanout_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

// roundTrips counts the client's round trips to Redis: single commands and
// pipelines alike.
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// plannerRig is a planner on a Redis and a JetStream of the test's own.
type plannerRig struct {
	rdb   *redis.Client // the store's, counted
	raw   *redis.Client
	js    jetstream.JetStream
	store *feeds.Store
	trips *roundTrips
	pcfg  fanout.PlannerConfig
	// bytes and biggest are the fan-out messages' bodies read back: in all,
	// and the largest.
	bytes, biggest, msgs int
}

func newPlannerRig(t *testing.T, cfg feeds.Config) *plannerRig {
	t.Helper()
	return newPlannerRigOn(t, cfg, localstack.NATSConfig{}, fanout.PlannerConfig{Partitions: 3, ItemsPerMessage: 5})
}

// newPlannerRigOn is newPlannerRig with the NATS server configured as ncfg
// and the planners as pcfg.
func newPlannerRigOn(t *testing.T, cfg feeds.Config, ncfg localstack.NATSConfig, pcfg fanout.PlannerConfig) *plannerRig {
	t.Helper()
	r := localstacktest.RedisForTest(t)
	ncfg.Dir = t.TempDir()
	ns, err := localstack.StartNATS(ncfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(ns.Shutdown)
	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	rig := &plannerRig{
		rdb:   redis.NewClient(&redis.Options{Addr: r.Addr()}),
		raw:   redis.NewClient(&redis.Options{Addr: r.Addr()}),
		js:    js,
		trips: &roundTrips{},
		pcfg:  pcfg,
	}
	t.Cleanup(func() { _ = rig.rdb.Close(); _ = rig.raw.Close() })
	rig.rdb.AddHook(rig.trips)
	rig.store = feeds.NewStore(rig.rdb, cfg)
	return rig
}

// planner is a planner on the rig, its stream made and its position read.
func (rig *plannerRig) planner(t *testing.T) *fanout.Planner {
	t.Helper()
	p := fanout.NewPlanner(rig.store, rig.js, rig.pcfg, nil)
	require.NoError(t, p.EnsureStream(t.Context()))
	_, err := p.Checkpoint(t.Context())
	require.NoError(t, err)
	return p
}

// plannerRun is what planning a log did: the work each recipient was sent,
// in order, and every key the planner left in Redis.
type plannerRun struct {
	work  map[domain.UserID][]inbox.Item
	state map[string]string
}

// run plans batches from an empty Redis and fan-out stream; before the
// batches flushed says, Redis forgets its scripts. It returns the round trips
// to Redis of each batch's Apply.
func (rig *plannerRig) run(t *testing.T, batches [][]events.Record, flushed map[int]bool) (plannerRun, []int64) {
	t.Helper()
	return rig.runFailing(t, batches, flushed, nil)
}

// runFailing is run where the batches failing says fail once first, after
// their changes to the graph and before their work is published (the fan-out
// stream takes none of its subjects), and are then applied again.
//
// The stream is emptied and its subjects moved rather than the stream deleted
// and created again: the server removes a deleted stream's files in the
// background, and creating the stream again under the same name while a
// previous removal runs failed now and then ("error creating store").
func (rig *plannerRig) runFailing(t *testing.T, batches [][]events.Record, flushed, failing map[int]bool) (plannerRun, []int64) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, rig.raw.FlushAll(ctx).Err())
	p := fanout.NewPlanner(rig.store, rig.js, rig.pcfg, nil)
	require.NoError(t, p.EnsureStream(ctx))
	stream, err := rig.js.Stream(ctx, fanout.FanoutStream)
	require.NoError(t, err)
	require.NoError(t, stream.Purge(ctx))
	_, err = p.Checkpoint(ctx)
	require.NoError(t, err)
	trips := make([]int64, len(batches))
	work := map[domain.UserID][]inbox.Item{}
	for i, b := range batches {
		if flushed[i] {
			require.NoError(t, rig.raw.ScriptFlush(ctx).Err())
			require.NoError(t, rig.raw.FunctionFlush(ctx).Err())
		}
		if failing[i] {
			cfg := stream.CachedInfo().Config
			cfg.Subjects = []string{"nowhere.>"}
			_, err := rig.js.UpdateStream(ctx, cfg)
			require.NoError(t, err)
			require.Error(t, p.Apply(ctx, b), "batch %d", i)
			require.NoError(t, p.EnsureStream(ctx))
		}
		before := rig.trips.n.Load()
		require.NoError(t, p.Apply(ctx, b), "batch %d", i)
		trips[i] = rig.trips.n.Load() - before
		for u, items := range rig.work(t) {
			work[u] = append(work[u], items...)
		}
	}
	return plannerRun{work: work, state: rig.dump(t)}, trips
}

// work reads back every fan-out message, in the order of the stream, and
// empties it.
func (rig *plannerRig) work(t *testing.T) map[domain.UserID][]inbox.Item {
	t.Helper()
	ctx := t.Context()
	stream, err := rig.js.Stream(ctx, fanout.FanoutStream)
	require.NoError(t, err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	work := map[domain.UserID][]inbox.Item{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		msg, err := stream.GetMsg(ctx, seq)
		require.NoError(t, err)
		rig.bytes += len(msg.Data)
		rig.biggest = max(rig.biggest, len(msg.Data))
		rig.msgs++
		items, err := fanout.DecodeWork(msg.Data)
		require.NoError(t, err)
		for _, it := range items {
			work[it.Recipient] = append(work[it.Recipient], it)
		}
	}
	require.NoError(t, stream.Purge(ctx))
	return work
}

// dump is every key in Redis with its value, as text.
func (rig *plannerRig) dump(t *testing.T) map[string]string {
	t.Helper()
	ctx := t.Context()
	keys, err := rig.raw.Keys(ctx, "*").Result()
	require.NoError(t, err)
	state := map[string]string{}
	for _, k := range keys {
		typ, err := rig.raw.Type(ctx, k).Result()
		require.NoError(t, err)
		var v any
		switch typ {
		case "set":
			m, err := rig.raw.SMembers(ctx, k).Result()
			require.NoError(t, err)
			slices.Sort(m)
			v = m
		case "zset":
			v, err = rig.raw.ZRangeWithScores(ctx, k, 0, -1).Result()
		case "string":
			v, err = rig.raw.Get(ctx, k).Result()
		default:
			t.Fatalf("key %s of type %s", k, typ)
		}
		require.NoError(t, err)
		state[k] = fmt.Sprint(v)
	}
	return state
}

// randomLog is n events over a few users, with follows and unfollows enough
// to take accounts across the big-account threshold and back within a batch.
func randomLog(rng *rand.Rand, n int) []events.Record {
	const users = 10
	user := func() domain.UserID { return domain.UserID(rng.IntN(users) + 1) }
	var (
		recs  []events.Record
		live  []events.PostCreated
		post  domain.PostID = 1000
		seq   uint64
		event = func(ev events.Event) {
			seq++
			recs = append(recs, events.Record{Seq: seq, Event: ev})
		}
	)
	for range n {
		a, b := user(), user()
		if a == b {
			b = a%users + 1
		}
		switch k := rng.IntN(100); {
		case k < 35:
			post += domain.PostID(rng.IntN(3) + 1)
			pc := events.PostCreated{PostID: post, UserID: a}
			live = append(live, pc)
			event(pc)
		case k < 45 && len(live) > 0:
			i := rng.IntN(len(live))
			event(events.PostDeleted{PostID: live[i].PostID, UserID: live[i].UserID})
			live = slices.Delete(live, i, i+1)
		case k < 75:
			event(events.UserFollowed{FollowerID: a, FolloweeID: b})
		case k < 95:
			event(events.UserUnfollowed{FollowerID: a, FolloweeID: b})
		default:
			event(events.PostLiked{PostID: post, UserID: a})
		}
	}
	return recs
}

// TestPlannerBatchesPlanAsEventByEvent: a batch is planned in a fixed number
// of round trips however many follows it holds (each follow used to be one),
// and plans exactly what the same events plan one batch each: the same work
// for every recipient, in the same order, and the same graph, outboxes and
// big accounts, also when an account crosses the big-account threshold and
// back within a batch (becoming big above 3 followers, small again at 2: the
// margin makes bigness depend on what it was, event by event), and when
// Redis lost its scripts before a batch (the
// outbox script must be loaded again before the changes are sent: without
// it, a batch is left half made).
func TestPlannerBatchesPlanAsEventByEvent(t *testing.T) {
	t.Parallel()
	rig := newPlannerRig(t, feeds.Config{BigThreshold: 3, BigMargin: 1, OutboxCap: 4})
	for seed := range uint64(6) {
		rng := rand.New(rand.NewPCG(seed, 7))
		log := randomLog(rng, 400)
		var batches, single [][]events.Record
		flushed := map[int]bool{}
		// The accounts' bigness as the log goes, to see the threshold crossed.
		followers := map[domain.UserID]map[domain.UserID]bool{}
		big := map[domain.UserID]bool{}
		crossed := map[bool]int{}
		for rest := log; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(80))
			b := rest[:n]
			rest = rest[n:]
			if rng.IntN(5) == 0 {
				flushed[len(batches)] = true
			}
			batches = append(batches, b)
			// The batch merges follows of the same pair: one batch per event
			// of the merged batch is the same log.
			for _, rec := range projections.MergeFollows(slices.Clone(b)).Records {
				single = append(single, []events.Record{rec})
				var a, b domain.UserID
				switch e := rec.Event.(type) {
				case events.UserFollowed:
					a, b = e.FollowerID, e.FolloweeID
				case events.UserUnfollowed:
					a, b = e.FollowerID, e.FolloweeID
				default:
					continue
				}
				if followers[b] == nil {
					followers[b] = map[domain.UserID]bool{}
				}
				_, follow := rec.Event.(events.UserFollowed)
				if follow {
					followers[b][a] = true
				} else {
					delete(followers[b], a)
				}
				n := len(followers[b])
				if is := n > 3 || (big[b] && n > 2); is != big[b] {
					big[b] = is
					crossed[is]++
				}
			}
		}
		want, _ := rig.run(t, single, nil)
		got, trips := rig.run(t, batches, flushed)
		require.Equal(t, want.state, got.state, "seed %d", seed)
		// The first item that differs, per recipient, says more than the diff.
		for u, w := range want.work {
			g := got.work[u]
			for i := range max(len(w), len(g)) {
				if i >= len(w) || i >= len(g) || fmt.Sprint(w[i]) != fmt.Sprint(g[i]) {
					t.Logf("user %d item %d:\nwant %v\ngot  %v", u, i, w[max(0, i-2):min(len(w), i+3)], g[max(0, i-2):min(len(g), i+3)])
					break
				}
			}
		}
		require.Equal(t, want.work, got.work, "seed %d", seed)
		assert.Greater(t, len(got.work), 3, "seed %d: work for few recipients", seed)
		assert.Positive(t, crossed[true], "seed %d: no account became big", seed)
		assert.Positive(t, crossed[false], "seed %d: no account stopped being big", seed)
		for i, n := range trips {
			if !flushed[i] {
				assert.LessOrEqual(t, n, int64(4), "seed %d: round trips of batch %d (%d events)", seed, i, len(batches[i]))
			}
		}
	}
}

// TestPlannerPlansAgainABatchThatFailedMidway: a batch that failed after its
// changes to the graph, before its work was published, is planned again from
// its first event and still finds the change of bigness it holds. Here an
// account that stops being big still sends its followers the posts of its big
// period to merge; with the big accounts stored among the graph's changes, the
// second planning found it small already, sent nothing, and those posts were
// missing from the followers' feeds for good.
func TestPlannerPlansAgainABatchThatFailedMidway(t *testing.T) {
	t.Parallel()
	rig := newPlannerRig(t, feeds.Config{BigThreshold: 3})
	const x domain.UserID = 100
	var log []events.Record
	add := func(ev events.Event) {
		log = append(log, events.Record{Seq: uint64(len(log) + 1), Event: ev})
	}
	for f := range domain.UserID(4) {
		add(events.UserFollowed{FollowerID: f + 1, FolloweeID: x})
	}
	add(events.PostCreated{PostID: 500, UserID: x}) // big: not pushed
	add(events.UserUnfollowed{FollowerID: 1, FolloweeID: x})
	add(events.PostCreated{PostID: 600, UserID: x})
	batches := [][]events.Record{log[:5], log[5:]}

	for _, failing := range []map[int]bool{nil, {1: true}} {
		got, _ := rig.runFailing(t, batches, nil, failing)
		for f := range domain.UserID(3) {
			var posts []domain.PostID
			for _, it := range got.work[f+2] {
				posts = append(posts, it.Posts...)
			}
			assert.Contains(t, posts, domain.PostID(500), "follower %d, failing %v: the big period's post", f+2, failing)
			assert.Contains(t, posts, domain.PostID(600), "follower %d, failing %v", f+2, failing)
		}
		assert.NotContains(t, got.state, "feed:v1:big", "failing %v: x is still big", failing)
	}
}

// TestPlannerKeepsBignessWithinTheMargin: an account becomes big above the
// threshold and is small again only at the threshold less the margin, so an
// account followed and unfollowed at the threshold does not send its whole
// outbox to every follower at each unfollow. Between the two it stays what
// it was: its posts are not pushed while it is big, and are pushed again
// once it has become small.
func TestPlannerKeepsBignessWithinTheMargin(t *testing.T) {
	t.Parallel()
	rig := newPlannerRig(t, feeds.Config{BigThreshold: 10, BigMargin: 3})
	const x domain.UserID = 100
	var log []events.Record
	var batches [][]events.Record
	add := func(evs ...events.Event) {
		var b []events.Record
		for _, ev := range evs {
			log = append(log, events.Record{Seq: uint64(len(log) + 1), Event: ev})
			b = append(b, log[len(log)-1])
		}
		batches = append(batches, b)
	}
	follow := func(f domain.UserID) events.Event { return events.UserFollowed{FollowerID: f, FolloweeID: x} }
	unfollow := func(f domain.UserID) events.Event { return events.UserUnfollowed{FollowerID: f, FolloweeID: x} }
	for f := range domain.UserID(10) {
		add(follow(f + 1))
	}
	add(events.PostCreated{PostID: 500, UserID: x}) // 10 followers: pushed
	add(follow(11))                                 // 11: big
	add(events.PostCreated{PostID: 600, UserID: x}) // not pushed
	for range 2 {                                   // 10 and 11 in turn, a batch each: still big
		add(unfollow(11))
		add(follow(11))
	}
	add(unfollow(11), unfollow(10), unfollow(9))    // 8: still big
	add(events.PostCreated{PostID: 700, UserID: x}) // not pushed
	add(unfollow(8))                                // 7: small, its outbox merged
	add(follow(8), follow(9), follow(10))           // 10: small
	add(events.PostCreated{PostID: 800, UserID: x}) // pushed
	add(follow(11))                                 // 11: big again
	got, _ := rig.run(t, batches, nil)

	for f := range domain.UserID(7) {
		var ops []string
		for _, it := range got.work[f+1] {
			ops = append(ops, fmt.Sprintf("%v%v", it.Op, it.Posts))
		}
		// The follow's merge of an empty outbox, the push of 500, one merge
		// when x became small again (of the posts of its big period and
		// before), and the push of 800.
		assert.Equal(t, []string{
			fmt.Sprintf("%v[]", inbox.OpMerge),
			fmt.Sprintf("%v[500]", inbox.OpPush),
			fmt.Sprintf("%v[700 600 500]", inbox.OpMerge),
			fmt.Sprintf("%v[800]", inbox.OpPush),
		}, ops, "follower %d", f+1)
	}
	// Follower 11 unfollowed and followed while x was big: merged nothing then.
	for _, it := range got.work[11] {
		if it.Op == inbox.OpMerge {
			assert.Empty(t, it.Posts, "follower 11 merged while x was big: %v", it)
		}
	}
	assert.Contains(t, got.state["feed:v1:big"], fmt.Sprint(x), "x has 11 followers: big")
}

// TestPlannerKeepsMessagesUnderTheServersLimit: the items per message bound
// the work of a partition in one message, but items differ in size (a follow
// carries up to the outbox cap of posts), and a message over the server's
// largest payload is refused: the planner would then fail the same batch for
// ever. Here the server takes 4 KiB and a batch's work is several times that
// in each partition; it is published whole, as the same events publish in
// messages of five items.
func TestPlannerKeepsMessagesUnderTheServersLimit(t *testing.T) {
	t.Parallel()
	var log []events.Record
	add := func(ev events.Event) {
		log = append(log, events.Record{Seq: uint64(len(log) + 1), Event: ev})
	}
	const authors, followers = 12, 150
	for a := range domain.UserID(authors) {
		for f := range domain.UserID(followers) {
			add(events.UserFollowed{FollowerID: 1000 + f, FolloweeID: a + 1})
		}
	}
	graph := len(log)
	for i := range 240 {
		add(events.PostCreated{PostID: domain.PostID(1_000_000 + i), UserID: domain.UserID(i%authors + 1)})
	}
	for f := range domain.UserID(followers) { // each merges posts of author 1
		add(events.UserUnfollowed{FollowerID: 1000 + f, FolloweeID: 1})
		add(events.UserFollowed{FollowerID: 1000 + f, FolloweeID: 1})
	}
	batches := [][]events.Record{log[:graph], log[graph:]}

	small := newPlannerRig(t, feeds.Config{BigThreshold: 1000})
	want, _ := small.run(t, batches, nil)
	const limit = 4 << 10
	rig := newPlannerRigOn(t, feeds.Config{BigThreshold: 1000}, localstack.NATSConfig{MaxPayload: limit},
		fanout.PlannerConfig{Partitions: 3, ItemsPerMessage: 100_000})
	got, _ := rig.run(t, batches, nil)
	require.Equal(t, want.work, got.work)
	require.Equal(t, want.state, got.state)
	assert.Greater(t, rig.bytes, 2*3*3*limit, "the work is not several times the limit in each partition of each batch: the test proves nothing")
	assert.LessOrEqual(t, rig.biggest, limit)
	t.Logf("%d bytes of work in %d messages, the largest %d", rig.bytes, rig.msgs, rig.biggest)
}

// TestPlannerSkipsWhatItAppliedAlready: after a crash between storing its
// position and acknowledging, the planner is given batches that begin with
// events it has applied. It plans only the rest, and plans them as a batch of
// those alone would: the facts and the merging of follows are of the new
// events, not of the whole batch (an old follow merged with a new unfollow of
// the same pair would otherwise be planned again, or not at all).
func TestPlannerSkipsWhatItAppliedAlready(t *testing.T) {
	t.Parallel()
	rig := newPlannerRig(t, feeds.Config{BigThreshold: 3, OutboxCap: 4})
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 11))
		log := randomLog(rng, 300)
		var exact, overlapping [][]events.Record
		for from := 0; from < len(log); {
			n := min(len(log)-from, 1+rng.IntN(60))
			exact = append(exact, log[from:from+n])
			back := 0
			if from > 0 {
				back = rng.IntN(min(from, 30) + 1) // events applied already
			}
			overlapping = append(overlapping, log[from-back:from+n])
			from += n
		}
		want, _ := rig.run(t, exact, nil)
		got, _ := rig.run(t, overlapping, nil)
		require.Equal(t, want.state, got.state, "seed %d", seed)
		require.Equal(t, want.work, got.work, "seed %d", seed)
	}
}

// TestPlannerNoticesAFlushBetweenItsRoundTrips: Redis loses everything after a
// batch's first round trip (the planner's state and the graph facts) and
// before its plan's reads. The plan's round trip reads the state again after
// those reads, so the batch fails as state lost before it publishes any work:
// the new follower's merge, planned from the emptied outbox, would say the
// inbox holds none of the author's posts. (Without that read, the follower
// count's own check stops this batch too, as a changed graph; a batch of
// posts alone has no such check.)
func TestPlannerNoticesAFlushBetweenItsRoundTrips(t *testing.T) {
	t.Parallel()
	rig := newPlannerRig(t, feeds.Config{})
	ctx := t.Context()
	p := rig.planner(t)
	const x domain.UserID = 100
	require.NoError(t, p.Apply(ctx, []events.Record{
		{Seq: 1, Event: events.UserFollowed{FollowerID: 1, FolloweeID: x}},
		{Seq: 2, Event: events.PostCreated{PostID: 500, UserID: x}},
	}))
	stream, err := rig.js.Stream(ctx, fanout.FanoutStream)
	require.NoError(t, err)
	before, err := stream.Info(ctx)
	require.NoError(t, err)

	p.SetBeforePlan(func() { require.NoError(t, rig.raw.FlushAll(ctx).Err()) })
	err = p.Apply(ctx, []events.Record{{Seq: 3, Event: events.UserFollowed{FollowerID: 2, FolloweeID: x}}})
	require.ErrorIs(t, err, fanout.ErrStateLost)
	after, err := stream.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, before.State.LastSeq, after.State.LastSeq, "work published from a plan made after the flush")
}

// TestAppliersRecordTheDelayOfTheirWork: an applier observes, for each work
// message it applies, the time since the oldest event the work comes from.
func TestAppliersRecordTheDelayOfTheirWork(t *testing.T) {
	t.Parallel()
	rig := newPlannerRig(t, feeds.Config{})
	ctx := t.Context()
	p := rig.planner(t)
	at := time.Now().Add(-3 * time.Second).Truncate(time.Millisecond)
	require.NoError(t, p.Apply(ctx, []events.Record{
		{Seq: 1, Envelope: events.Envelope{OccurredAt: at.Add(time.Second)}, Event: events.UserFollowed{FollowerID: 1, FolloweeID: 100}},
		{Seq: 2, Envelope: events.Envelope{OccurredAt: at}, Event: events.UserFollowed{FollowerID: 2, FolloweeID: 100}},
	}))
	stream, err := rig.js.Stream(ctx, fanout.FanoutStream)
	require.NoError(t, err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	published := info.State.Msgs
	require.Positive(t, published)

	reg := prometheus.NewRegistry()
	runAppliers(t, rig, fanout.NewApplier(rig.store, rig.js, []int{0, 1, 2}, projections.NewMetrics(reg), slog.New(slog.DiscardHandler)))

	h := appliersDelay(t, reg)
	assert.Equal(t, published, h.GetSampleCount())
	// Each from the older follow: 3 s ago and some.
	assert.GreaterOrEqual(t, h.GetSampleSum(), 3.0*float64(published))
	assert.Less(t, h.GetSampleSum(), 13.0*float64(published))
}

// TestAppliersApplyWorkInOrderPastAFailure: an applier takes its next
// message while it applies one, but a message that fails is applied again
// before the one delivered behind it. Here the message behind it removes a
// post from the same inbox, which moves the inbox's sequence past the failed
// push's: applied first, it would make the push, when it came again, a
// no-op, and the post would never reach the feed.
func TestAppliersApplyWorkInOrderPastAFailure(t *testing.T) {
	t.Parallel()
	rig := newPlannerRig(t, feeds.Config{})
	ctx := t.Context()
	rig.planner(t) // the fan-out stream
	alice := domain.UserID(7)
	_, err := inbox.Apply(ctx, rig.store, []inbox.Item{{Recipient: alice, Seq: 1, Op: inbox.OpMaterialise, Posts: []domain.PostID{1}}})
	require.NoError(t, err)
	push := inbox.Item{Recipient: alice, Seq: 10, Op: inbox.OpPush, Posts: []domain.PostID{50}}
	remove := inbox.Item{Recipient: alice, Seq: 20, Op: inbox.OpRemove, Posts: []domain.PostID{1}}
	for _, it := range []inbox.Item{push, remove} {
		body, err := fanout.EncodeWork([]inbox.Item{it})
		require.NoError(t, err)
		msg := nats.NewMsg(fmt.Sprintf("fanout.%d", fanout.Partition(alice, 3)))
		msg.Data = body
		msg.Header.Set("Feed-From-Seq", strconv.FormatUint(it.Seq, 10))
		_, err = rig.js.PublishMsg(ctx, msg)
		require.NoError(t, err)
	}

	a := fanout.NewApplier(rig.store, rig.js, []int{0, 1, 2}, nil, slog.New(slog.DiscardHandler))
	var pushes atomic.Int32
	a.SetBeforeApply(func(items []inbox.Item) error {
		if items[0].Seq != push.Seq || pushes.Add(1) > 1 {
			return nil
		}
		time.Sleep(200 * time.Millisecond) // the removal is delivered meanwhile
		return errors.New("injected failure")
	})
	runAppliers(t, rig, a)

	assert.EqualValues(t, 2, pushes.Load(), "the push failed once and came again")
	posts, _, _, ok, err := inbox.ReadAll(ctx, rig.store, alice)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, []domain.PostID{50}, posts, "the push applied before the removal")
}

// runAppliers runs a until the fan-out stream is empty, and stops it.
func runAppliers(t *testing.T, rig *plannerRig, a *fanout.Applier) {
	t.Helper()
	ctx := t.Context()
	stream, err := rig.js.Stream(ctx, fanout.FanoutStream)
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	require.Eventually(t, func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.Msgs == 0
	}, 10*time.Second, 10*time.Millisecond)
	stop()
	require.NoError(t, <-done)
}

// appliersDelay is the appliers' feed_projector_delay_seconds in reg.
func appliersDelay(t *testing.T, reg *prometheus.Registry) *dto.Histogram {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if f.GetName() == "feed_projector_delay_seconds" && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == fanout.AppliersName {
				return m.GetHistogram()
			}
		}
	}
	require.Fail(t, "no delay histogram for the appliers")
	return nil
}

// TestPlannerWaitsForTheAppliers: with PendingWork, the planner returns from
// a batch only once no more than that many fan-out messages wait for the
// appliers, so that its next batch takes in what arrived meanwhile; without
// it, it never waits.
func TestPlannerWaitsForTheAppliers(t *testing.T) {
	t.Parallel()
	rig := newPlannerRigOn(t, feeds.Config{}, localstack.NATSConfig{}, fanout.PlannerConfig{Partitions: 3, ItemsPerMessage: 1, PendingWork: 2})
	ctx := t.Context()
	p := rig.planner(t)
	p.SetAppliersStall(3 * time.Second)
	// Four followers, a work message each (one item a message).
	var log []events.Record
	for f := range domain.UserID(4) {
		log = append(log, events.Record{Seq: uint64(len(log) + 1), Event: events.UserFollowed{FollowerID: 10 + f, FolloweeID: 100}})
	}
	stream, err := rig.js.Stream(ctx, fanout.FanoutStream)
	require.NoError(t, err)
	pending := func() uint64 {
		info, err := stream.Info(ctx)
		require.NoError(t, err)
		return info.State.Msgs
	}

	// Given no applier running, the batch's work stays
	done := make(chan error, 1)
	go func() { done <- p.Apply(ctx, log) }()
	require.Eventually(t, func() bool { return pending() == 4 }, 10*time.Second, time.Millisecond)
	select {
	case err := <-done:
		require.Failf(t, "the planner did not wait", "Apply returned %v with 4 messages pending", err)
	case <-time.After(200 * time.Millisecond):
	}

	// When the appliers run, it returns once they have left at most two.
	a := fanout.NewApplier(rig.store, rig.js, []int{0, 1, 2}, nil, slog.New(slog.DiscardHandler))
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- a.Run(runCtx) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		require.Fail(t, "the planner still waits with the appliers running")
	}
	assert.LessOrEqual(t, pending(), uint64(2))

	// With the appliers stopped, it waits for them only as long as the stall
	// time: a shutdown stops them before the planner's batch ends.
	stop()
	require.NoError(t, <-ran)
	p.SetAppliersStall(300 * time.Millisecond)
	var stalled []events.Record
	for f := range domain.UserID(4) {
		stalled = append(stalled, events.Record{Seq: uint64(len(log) + len(stalled) + 1), Event: events.UserFollowed{FollowerID: 30 + f, FolloweeID: 100}})
	}
	log = append(log, stalled...)
	start := time.Now()
	require.NoError(t, p.Apply(ctx, stalled))
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "it waited for the appliers")
	assert.Greater(t, pending(), uint64(2))

	// And a planner without PendingWork does not wait for work nobody applies.
	rig.pcfg.PendingWork = 0
	q := rig.planner(t)
	more := []events.Record{}
	for f := range domain.UserID(4) {
		more = append(more, events.Record{Seq: uint64(len(log) + len(more) + 1), Event: events.UserFollowed{FollowerID: 20 + f, FolloweeID: 100}})
	}
	require.NoError(t, q.Apply(ctx, more))
	assert.GreaterOrEqual(t, pending(), uint64(4))
}
