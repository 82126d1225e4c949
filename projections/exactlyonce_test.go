package projections_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/cmd/localstack/natscluster"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/feeds/inbox"
	"github.com/feedproject/feed/projections/readmodel"
)

// onceUsers is how many users the load acts for: few enough that follows
// and unfollows of the same pairs meet, and every inbox gets pushes.
const onceUsers = 24

// onceRig is the service's projectors — the read model and both stages of
// the feeds — on a connection of their own, and a load of commands appended
// on another, as the API appends them.
type onceRig struct {
	log    *events.Log // the appender's
	projNC *nats.Conn  // the projectors'
	live   *pgxpool.Pool
	clean  *pgxpool.Pool
	store  *feeds.Store
	// readAt and planAt are where the read model and the planner are.
	readAt, planAt func() uint64
	stop           func()

	appended, failed atomic.Int64
	head             atomic.Uint64 // the highest position an append was answered with
}

// newOnceRig appends through appendURL, projects through projectURL, and
// keeps the event log at replicas.
func newOnceRig(t *testing.T, appendURL, projectURL string, replicas int) *onceRig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rig := newOnceStores(t, appendURL, replicas)
	projNC, projLog := onceConnect(t, projectURL, replicas)
	rig.projNC = projNC
	planner := fanout.NewPlanner(rig.store, projLog.JetStream(), oncePlannerConfig(replicas), nil)
	require.NoError(t, planner.EnsureStream(ctx))

	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	readRun := projections.NewRunner(projLog, readmodel.NewProjector(rig.live, nil), onceRunnerConfig, nil, logger)
	planRun := projections.NewRunner(projLog, planner, onceRunnerConfig, nil, logger)
	rig.readAt, rig.planAt = readRun.Position, planRun.Position
	appliers := fanout.NewApplier(rig.store, projLog.JetStream(), []int{0, 1, 2}, nil, logger)
	var wg sync.WaitGroup
	wg.Go(func() { _ = readRun.Run(ctx) })
	wg.Go(func() { _ = planRun.Run(ctx) })
	wg.Go(func() { _ = appliers.Run(ctx) })
	wg.Go(func() { materialise(ctx, planner) })
	var once sync.Once
	rig.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(rig.stop)
	return rig
}

// onceRunnerConfig is the runners': small batches, many fetches, so that a
// fault finds one under way.
var onceRunnerConfig = projections.RunnerConfig{BatchSize: 20, FetchWait: 100 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}

// oncePlannerConfig is the planners': three partitions, small messages.
func oncePlannerConfig(replicas int) fanout.PlannerConfig {
	return fanout.PlannerConfig{Partitions: 3, ItemsPerMessage: 7, Replicas: replicas}
}

// materialise builds the inboxes readers ask for until ctx ends, as serve's
// loop does.
func materialise(ctx context.Context, planner *fanout.Planner) {
	for ctx.Err() == nil {
		_, _ = planner.Materialise(ctx, 100)
		time.Sleep(5 * time.Millisecond)
	}
}

// newOnceStores is a rig without projectors: the read model's live and
// clean databases, Redis with every user's inbox asked for, and the
// appender's log at appendURL.
func newOnceStores(t *testing.T, appendURL string, replicas int) *onceRig {
	t.Helper()
	pg := localstacktest.PostgresForTest(t)
	rd := localstacktest.RedisForTest(t)
	rig := &onceRig{}
	rig.live, rig.clean = onceDatabase(t, pg, "live"), onceDatabase(t, pg, "clean")
	_, rig.log = onceConnect(t, appendURL, replicas)
	rdb := redis.NewClient(&redis.Options{Addr: rd.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	rig.store = feeds.NewStore(rdb, feeds.Config{})
	for u := range onceUsers {
		require.NoError(t, rig.store.RequestMaterialise(context.Background(), domain.UserID(u+1)))
	}
	return rig
}

// onceConnect connects as the service connects — reconnecting for ever,
// nothing buffered, and only through the URLs given, which may be the
// test's proxies — and opens the log at replicas.
func onceConnect(t *testing.T, url string, replicas int) (*nats.Conn, *events.Log) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectBufSize(-1),
		nats.IgnoreDiscoveredServers())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	log, err := events.OpenLog(context.Background(), js, events.Config{Replicas: replicas}, nil)
	require.NoError(t, err)
	t.Cleanup(log.Close)
	return nc, log
}

// onceDatabase is a new migrated database on pg.
func onceDatabase(t *testing.T, pg *localstack.Postgres, name string) *pgxpool.Pool {
	t.Helper()
	pool, err := readmodel.OpenPool(context.Background(), localstacktest.DatabaseCopyForTest(t, pg, name), migrations.Schema, 0)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// load appends posts, follows, unfollows and deletes from workers goroutines,
// each pausing pace after every append, until the returned function is
// called (which waits for them). Appends that
// fail (a node down) are counted and not retried: whatever the log took is
// what the projectors must show.
func (rig *onceRig) load(workers int, pace time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 40))
			ids, _ := domain.NewIDGenerator(w + 1)
			var mine []events.PostCreated
			user := func() domain.UserID { return domain.UserID(rng.IntN(onceUsers) + 1) }
			for i := 0; ctx.Err() == nil; i++ {
				var ev events.Event
				a, b := user(), user()
				switch k := rng.IntN(100); {
				case k < 45:
					id, at := ids.Next(time.Now())
					ev = events.PostCreated{PostID: domain.PostID(id), UserID: a, CreatedAt: at, Caption: "p",
						Media: []events.Media{{Key: fmt.Sprintf("%064d.png", id), ContentType: "image/png", Width: 1, Height: 1, Size: 1}}}
				case k < 80 && a != b:
					ev = events.UserFollowed{FollowerID: a, FolloweeID: b}
				case k < 95 && a != b:
					ev = events.UserUnfollowed{FollowerID: a, FolloweeID: b}
				case len(mine) > 0:
					// A worker deletes the posts it made.
					j := rng.IntN(len(mine))
					ev = events.PostDeleted{PostID: mine[j].PostID, UserID: mine[j].UserID, DeletedAt: time.Now()}
					mine = slices.Delete(mine, j, j+1)
				default:
					continue
				}
				actx, acancel := context.WithTimeout(ctx, 2*time.Second)
				res, err := rig.log.AppendEvent(actx, fmt.Sprintf("w%d-%d", w, i), time.Now(), ev)
				acancel()
				if err != nil {
					rig.failed.Add(1)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				rig.appended.Add(1)
				time.Sleep(pace)
				for h := rig.head.Load(); res.Seq > h && !rig.head.CompareAndSwap(h, res.Seq); h = rig.head.Load() {
				}
				if pc, ok := ev.(events.PostCreated); ok {
					mine = append(mine, pc)
				}
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

// positions is where the projectors stand, for the test's log.
func (rig *onceRig) positions() string {
	return fmt.Sprintf("appended up to %d, read model at %d, planner at %d", rig.head.Load(), rig.readAt(), rig.planAt())
}

// settled says which projectors applied the whole log.
type settled struct{ planner, feeds bool }

// settle waits, once the appends have stopped, until the projectors have
// applied the whole log, then stops them. The read model must get there; the
// feeds may not (work lost on the way to the appliers can hold them back for
// good), and what did is still worth checking.
func (rig *onceRig) settle(t *testing.T, timeout time.Duration) settled {
	t.Helper()
	defer rig.stop()
	ctx := context.Background()
	var head uint64
	require.Eventually(t, func() bool {
		var err error
		head, err = rig.log.Head(ctx)
		return err == nil
	}, timeout, 50*time.Millisecond, "the log's head")
	t.Logf("settling at %d: %d appends answered, %d failed", head, rig.appended.Load(), rig.failed.Load())
	var feedsAt, reported uint64
	start := time.Now()
	deadline, report, stalled := start.Add(timeout), start, 0
	for rig.readAt() < head || rig.planAt() < head || feedsAt < head {
		if time.Since(report) >= 2*time.Second {
			report = time.Now()
			t.Logf("settling, at %s: %s, feeds at %d", since(start), rig.positions(), feedsAt)
			// Work planned and not applied for a while: say where the
			// appliers wait, once.
			if stalled++; feedsAt > reported || rig.planAt() <= feedsAt {
				stalled = 0
			}
			if stalled == 3 {
				t.Logf("the feeds stay at %d: %s\nwhere the appliers are:\n%s", feedsAt, rig.fanoutState(ctx), stacksOf("fanout.(*Applier)"))
			}
			reported = feedsAt
		}
		if time.Now().After(deadline) {
			if rig.readAt() < head {
				t.Fatalf("the read model did not reach the head %d within %s: %s", head, timeout, rig.positions())
			}
			t.Errorf("the feeds did not reach the head %d within %s: %s, feeds at %d; %s\nwhere the appliers are:\n%s",
				head, timeout, rig.positions(), feedsAt, rig.fanoutState(ctx), stacksOf("fanout.(*Applier)"))
			return settled{planner: rig.planAt() >= head}
		}
		time.Sleep(20 * time.Millisecond)
		if pos, err := fanout.Position(ctx, rig.store, rig.log.JetStream()); err == nil {
			feedsAt = pos
		}
	}
	t.Logf("settled in %s", since(start))
	return settled{planner: true, feeds: true}
}

// stacksOf is the stacks of this process's goroutines that pass through fn,
// for a failure to make progress.
func stacksOf(fn string) string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// fanoutState describes the fan-out stream and its consumers, for a failure
// of the feeds to catch up.
func (rig *onceRig) fanoutState(ctx context.Context) string {
	js := rig.log.JetStream()
	stream, err := js.Stream(ctx, fanout.FanoutStream)
	if err != nil {
		return fmt.Sprintf("fan-out stream: %v", err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Sprintf("fan-out stream: %v", err)
	}
	out := fmt.Sprintf("fan-out stream holds %d messages from %d", info.State.Msgs, info.State.FirstSeq)
	for name := range stream.ListConsumers(ctx).Info() {
		out += fmt.Sprintf("; consumer %s delivered %d, acknowledged to %d, %d pending acknowledgement, %d undelivered, %d redelivered",
			name.Name, name.Delivered.Stream, name.AckFloor.Stream, name.NumAckPending, name.NumPending, name.NumRedelivered)
	}
	return out
}

// check compares the live read model with a clean replay of the log, row for
// row; then, as far as they got, the feeds with the replayed read model: the
// planner's graph (every user's followees and outbox) and every inbox with
// the pull feed.
func (rig *onceRig) check(t *testing.T, got settled) {
	t.Helper()
	ctx := context.Background()
	onceReplay(t, rig.log, rig.clean)
	want, have := onceDump(t, rig.clean), onceDump(t, rig.live)
	if want != have {
		t.Errorf("the read model differs from a clean replay of the log:\n%s", lineDiff(want, have))
	}
	if !got.planner {
		return
	}
	store, err := rig.store.Active(ctx)
	require.NoError(t, err)
	for u := range onceUsers {
		user := domain.UserID(u + 1)
		following, err := store.Following(ctx, user)
		require.NoError(t, err)
		slices.Sort(following)
		followees := onceIDs[domain.UserID](t, rig.clean, `SELECT followee_id FROM follows WHERE follower_id = $1 ORDER BY followee_id`, user)
		if !slices.Equal(followees, following) {
			t.Errorf("user %d follows %v in the log, %v in Redis", user, followees, following)
		}
		outboxes, err := store.Outboxes(ctx, []domain.UserID{user})
		require.NoError(t, err)
		out := outboxes[user]
		posts := onceIDs[domain.PostID](t, rig.clean, `SELECT id FROM posts WHERE user_id = $1 AND deleted_at IS NULL AND id >= $2 ORDER BY id DESC`, user, out.Floor)
		if !slices.Equal(posts, out.Posts) {
			t.Errorf("user %d: the outbox above its floor %d is not the user's posts: %d missing %v, %d extra %v",
				user, out.Floor, len(minus(posts, out.Posts)), firstOf(minus(posts, out.Posts)), len(minus(out.Posts, posts)), firstOf(minus(out.Posts, posts)))
		}
	}
	if got.feeds {
		rig.checkInboxes(t, store)
	}
}

// onceIDs runs a query of one integer column with user as its first argument.
func onceIDs[ID ~int64](t *testing.T, pool *pgxpool.Pool, query string, user domain.UserID, args ...any) []ID {
	t.Helper()
	rows, err := pool.Query(context.Background(), query, append([]any{int64(user)}, args...)...)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ID, error) {
		var id int64
		err := r.Scan(&id)
		return ID(id), err
	})
	require.NoError(t, err)
	return ids
}

// checkInboxes compares every user's inbox above its floor with the pull feed
// over the replayed read model, but for big accounts' posts, which reads
// merge from their outboxes.
func (rig *onceRig) checkInboxes(t *testing.T, store *feeds.Store) {
	t.Helper()
	ctx := context.Background()
	truth := readmodel.NewStore(rig.clean)
	big, err := store.BigAccounts(ctx)
	require.NoError(t, err)
	for u := range onceUsers {
		user := domain.UserID(u + 1)
		held, floor, seq, ok, err := inbox.ReadAll(ctx, store, user)
		require.NoError(t, err)
		if !ok {
			t.Errorf("user %d: no inbox", user)
			continue
		}
		entries, err := truth.Feed(ctx, user, nil, 1_000_000)
		require.NoError(t, err)
		fromBig := map[domain.PostID]bool{}
		var wantIDs, haveIDs []domain.PostID
		for _, e := range entries {
			switch {
			case slices.Contains(big, e.AuthorID):
				fromBig[e.PostID] = true
			case int64(e.PostID) >= floor:
				wantIDs = append(wantIDs, e.PostID)
			}
		}
		for _, p := range held {
			if !fromBig[p] {
				haveIDs = append(haveIDs, p)
			}
		}
		if !slices.Equal(wantIDs, haveIDs) {
			missing, extra := minus(wantIDs, haveIDs), minus(haveIDs, wantIDs)
			t.Errorf("user %d: the inbox above its floor %d (at %d) is not the pull feed: %d posts missing %v, %d extra %v%s",
				user, floor, seq, len(missing), firstOf(missing), len(extra), firstOf(extra), rig.history(t, user, append(firstOf(missing), firstOf(extra)...)))
		}
	}
}

// history finds in the log the events of posts and the follows and unfollows
// between user and their authors, for a failure's message.
func (rig *onceRig) history(t *testing.T, user domain.UserID, posts []domain.PostID) string {
	t.Helper()
	type line struct {
		text     string
		followee domain.UserID // of a follow or unfollow
	}
	authors := map[domain.UserID]bool{}
	var lines []line
	require.NoError(t, rig.log.Read(context.Background(), events.ReadOptions{StopAtEnd: true}, func(r events.Record) error {
		switch ev := r.Event.(type) {
		case events.PostCreated:
			if slices.Contains(posts, ev.PostID) {
				authors[ev.UserID] = true
				lines = append(lines, line{text: fmt.Sprintf("%d: %d posts %d", r.Seq, ev.UserID, ev.PostID)})
			}
		case events.PostDeleted:
			if slices.Contains(posts, ev.PostID) {
				lines = append(lines, line{text: fmt.Sprintf("%d: %d deletes %d", r.Seq, ev.UserID, ev.PostID)})
			}
		case events.UserFollowed:
			if ev.FollowerID == user {
				lines = append(lines, line{fmt.Sprintf("%d: %d follows %d", r.Seq, user, ev.FolloweeID), ev.FolloweeID})
			}
		case events.UserUnfollowed:
			if ev.FollowerID == user {
				lines = append(lines, line{fmt.Sprintf("%d: %d unfollows %d", r.Seq, user, ev.FolloweeID), ev.FolloweeID})
			}
		}
		return nil
	}))
	var b strings.Builder
	for _, l := range lines {
		if l.followee == 0 || authors[l.followee] {
			b.WriteString("\n\t" + l.text)
		}
	}
	return b.String()
}

func minus(a, b []domain.PostID) []domain.PostID {
	var out []domain.PostID
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// since is the time from start, for the test's log.
func since(start time.Time) time.Duration { return time.Since(start).Round(time.Millisecond) }

func firstOf[T any](s []T) []T { return s[:min(len(s), 5)] }

// onceReplay builds a read model from sequence 1 with plain reads of the log,
// independent of the runner under test.
func onceReplay(t *testing.T, log *events.Log, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	p := readmodel.NewProjector(pool, nil)
	var batch []events.Record
	require.NoError(t, log.Read(ctx, events.ReadOptions{StopAtEnd: true, IncludeUnknown: true}, func(r events.Record) error {
		if batch = append(batch, r); len(batch) == 500 {
			err := p.Apply(ctx, batch)
			batch = nil
			return err
		}
		return nil
	}))
	if len(batch) > 0 {
		require.NoError(t, p.Apply(ctx, batch))
	}
}

// onceDump renders every read model table, ordered, a row a line.
func onceDump(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var b strings.Builder
	for _, q := range []string{
		`SELECT 'post', id, user_id, caption, created_at, edited_at, deleted_at, like_count, comment_count FROM posts ORDER BY id`,
		`SELECT 'media', post_id, position, media_key FROM post_media ORDER BY post_id, position`,
		`SELECT 'follow', follower_id, followee_id, created_at FROM follows ORDER BY follower_id, followee_id`,
		`SELECT 'like', post_id, user_id FROM likes ORDER BY post_id, user_id`,
		`SELECT 'comment', id, post_id, user_id, text, created_at FROM comments ORDER BY id`,
	} {
		rows, err := pool.Query(context.Background(), q)
		require.NoError(t, err)
		for rows.Next() {
			vals, err := rows.Values()
			require.NoError(t, err)
			fmt.Fprintln(&b, vals...)
		}
		require.NoError(t, rows.Err())
	}
	return b.String()
}

// lineDiff lists, up to ten of each, the lines only in want and only in have.
func lineDiff(want, have string) string {
	w, h := strings.Split(want, "\n"), strings.Split(have, "\n")
	var b strings.Builder
	for _, side := range []struct {
		name     string
		from, in []string
	}{{"missing", w, h}, {"extra", h, w}} {
		var only []string
		for _, l := range side.from {
			if !slices.Contains(side.in, l) {
				only = append(only, l)
			}
		}
		fmt.Fprintf(&b, "%d rows %s, e.g.\n\t%s\n", len(only), side.name, strings.Join(firstOf(only), "\n\t"))
	}
	return b.String()
}

// TestNoEventSkippedWhenTheProjectorsNodeOrTheLeaderIsKilled kills, under a
// steady load of posts and follows, the node the projectors' connection goes
// through and, in turn, the event stream's leader, at random points, and
// restarts each: afterwards the read model equals a clean replay row for row
// and every inbox is the pull feed. The projectors reach each node through a
// proxy, and their node dies as messages to them are on their way (the proxy
// cuts the connection then, and the node is killed at once): those messages
// are never read, and only a consumer that notices the gap in the sequences
// reads them again.
func TestNoEventSkippedWhenTheProjectorsNodeOrTheLeaderIsKilled(t *testing.T) {
	c := natscluster.Start(t, natscluster.Config{SyncAlways: true})
	proxies := make([]*natscluster.Proxy, c.Size())
	urls := make([]string, c.Size())
	for i := range proxies {
		proxies[i] = natscluster.NewProxy(t, c.Addr(i))
		urls[i] = proxies[i].URL()
	}
	rig := newOnceRig(t, c.URLs(), strings.Join(urls, ","), 3)
	// A lighter load than on one server: the appliers apply work from a
	// replicated stream, synced on every node.
	stopLoad := rig.load(3, 15*time.Millisecond)
	defer stopLoad()
	seed := uint64(time.Now().UnixNano())
	t.Logf("kill points seeded with %d", seed)
	rng := rand.New(rand.NewPCG(seed, 40))
	const kills = 10
	start := time.Now()
	for k := range kills {
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		victim := c.ServerOf(rig.projNC)
		if k%2 == 1 || victim < 0 {
			victim = c.WaitForStreamLeader("FEED_EVENTS", 10*time.Second)
			t.Logf("kill %d at %s: node %d, the stream leader; %s", k+1, since(start), victim, rig.positions())
		} else {
			// Mostly events to the runners, now and then work to the appliers.
			marker := "HMSG ev."
			if k%6 == 4 {
				marker = "HMSG fanout."
			}
			select {
			case <-proxies[victim].CutOnNext([]byte(marker)):
				t.Logf("kill %d at %s: node %d, the projectors', as %q was on its way; %s", k+1, since(start), victim, marker, rig.positions())
			case <-time.After(2 * time.Second):
				proxies[victim].CutAll()
				t.Logf("kill %d at %s: node %d, the projectors', no %q for two seconds; %s", k+1, since(start), victim, marker, rig.positions())
			}
		}
		c.Kill(victim)
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		c.Restart(victim)
		c.WaitForReady(20 * time.Second)
		c.WaitForStreamCurrent(victim, "FEED_EVENTS", 20*time.Second)
	}
	stopLoad()
	rig.check(t, rig.settle(t, time.Minute))
}

// TestNoEventSkippedWhenTheProjectorsConnectionIsCut is the test above on one
// server, whose connection to the projectors a proxy cuts under load at
// random points, each just as messages are on their way: events to the
// runners, or work to the appliers, in turn.
func TestNoEventSkippedWhenTheProjectorsConnectionIsCut(t *testing.T) {
	ns := localstacktest.NATSForTest(t)
	proxy := natscluster.NewProxy(t, ns.Server().Addr().String())
	rig := newOnceRig(t, ns.ClientURL(), proxy.URL(), 1)
	stopLoad := rig.load(4, 5*time.Millisecond)
	defer stopLoad()
	seed := uint64(time.Now().UnixNano())
	t.Logf("cut points seeded with %d", seed)
	rng := rand.New(rand.NewPCG(seed, 41))
	const cuts = 30
	start := time.Now()
	for k := range cuts {
		time.Sleep(time.Duration(50+rng.IntN(250)) * time.Millisecond)
		marker := "HMSG ev."
		if k%2 == 1 {
			marker = "HMSG fanout."
		}
		select {
		case <-proxy.CutOnNext([]byte(marker)):
			t.Logf("cut %d at %s: on %q; %s", k+1, since(start), marker, rig.positions())
		case <-time.After(500 * time.Millisecond):
			t.Logf("cut %d at %s: no %q for half a second, cut %d connections; %s", k+1, since(start), marker, proxy.CutAll(), rig.positions())
		}
	}
	stopLoad()
	rig.check(t, rig.settle(t, time.Minute))
}
