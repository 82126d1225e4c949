package projections_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	log     *events.Log // the appender's
	projNC  *nats.Conn  // the projectors'
	live    *pgxpool.Pool
	clean   *pgxpool.Pool
	store   *feeds.Store
	readRun *projections.Runner
	planRun *projections.Runner
	stop    func()

	appended, failed atomic.Int64
	head             atomic.Uint64 // the highest position an append was answered with
}

// newOnceRig appends through appendURL, projects through projectURL, and
// keeps the event log at replicas.
func newOnceRig(t *testing.T, appendURL, projectURL string, replicas int) *onceRig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pg := localstacktest.PostgresForTest(t)
	rd := localstacktest.RedisForTest(t)
	rig := &onceRig{}
	rig.live, rig.clean = onceDatabase(t, pg, "live"), onceDatabase(t, pg, "clean")

	connect := func(url string) (*nats.Conn, *events.Log) {
		// As the service connects: reconnecting for ever, nothing buffered.
		nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectBufSize(-1))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		log, err := events.OpenLog(ctx, js, events.Config{Replicas: replicas}, nil)
		require.NoError(t, err)
		t.Cleanup(log.Close)
		return nc, log
	}
	_, rig.log = connect(appendURL)
	projNC, projLog := connect(projectURL)
	rig.projNC = projNC

	rdb := redis.NewClient(&redis.Options{Addr: rd.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	rig.store = feeds.NewStore(rdb, feeds.Config{})
	planner := fanout.NewPlanner(rig.store, projLog.JetStream(), fanout.PlannerConfig{Partitions: 3, ItemsPerMessage: 7}, nil)
	require.NoError(t, planner.EnsureStream(ctx))
	for u := range onceUsers {
		require.NoError(t, rig.store.RequestMaterialise(ctx, domain.UserID(u+1)))
	}

	// Small batches: many fetches, so a fault finds one under way.
	cfg := projections.RunnerConfig{BatchSize: 20, FetchWait: 100 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	rig.readRun = projections.NewRunner(projLog, readmodel.NewProjector(rig.live, nil), cfg, nil, logger)
	rig.planRun = projections.NewRunner(projLog, planner, cfg, nil, logger)
	appliers := fanout.NewApplier(rig.store, projLog.JetStream(), []int{0, 1, 2}, nil, logger)
	var wg sync.WaitGroup
	wg.Go(func() { _ = rig.readRun.Run(ctx) })
	wg.Go(func() { _ = rig.planRun.Run(ctx) })
	wg.Go(func() { _ = appliers.Run(ctx) })
	wg.Go(func() {
		for ctx.Err() == nil {
			_, _ = planner.Materialise(ctx, 100)
			time.Sleep(5 * time.Millisecond)
		}
	})
	var once sync.Once
	rig.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(rig.stop)
	return rig
}

// onceDatabase is a new migrated database on pg.
func onceDatabase(t *testing.T, pg *localstack.Postgres, name string) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, pg.AdminURL())
	require.NoError(t, err)
	defer admin.Close()
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE feed")
	require.NoError(t, err)
	pool, err := readmodel.OpenPool(ctx, strings.Replace(pg.URL(), "/feed?", "/"+name+"?", 1), migrations.Schema, 0)
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
	return fmt.Sprintf("appended up to %d, read model at %d, planner at %d", rig.head.Load(), rig.readRun.Position(), rig.planRun.Position())
}

// settle waits, once the appends have stopped, until the projectors have
// applied the whole log, then stops them. It reports whether the feeds caught
// up: work lost on the way to the appliers can hold them back for good, and
// the read model is still worth checking then.
func (rig *onceRig) settle(t *testing.T, timeout time.Duration) (feedsCaughtUp bool) {
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
	require.Eventually(t, func() bool { return rig.readRun.Position() >= head }, timeout, 20*time.Millisecond,
		"the read model did not reach the head %d within %s: %s", head, timeout, rig.positions())
	var feedsAt uint64
	deadline := time.Now().Add(timeout)
	for feedsAt < head {
		if time.Now().After(deadline) {
			t.Errorf("the feeds did not reach the head %d within %s: %s, feeds at %d; %s",
				head, timeout, rig.positions(), feedsAt, rig.fanoutState(ctx))
			return false
		}
		time.Sleep(20 * time.Millisecond)
		if pos, err := fanout.Position(ctx, rig.store, rig.log.JetStream()); err == nil {
			feedsAt = pos
		}
	}
	return true
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
// row, and, when they caught up, the feeds with the replayed read model:
// every user's followees, and every inbox with the pull feed.
func (rig *onceRig) check(t *testing.T, feedsCaughtUp bool) {
	t.Helper()
	ctx := context.Background()
	onceReplay(t, rig.log, rig.clean)
	want, have := onceDump(t, rig.clean), onceDump(t, rig.live)
	if want != have {
		t.Errorf("the read model differs from a clean replay of the log:\n%s", lineDiff(want, have))
	}
	if !feedsCaughtUp {
		return
	}

	store, err := rig.store.Active(ctx)
	require.NoError(t, err)
	truth := readmodel.NewStore(rig.clean)
	big, err := store.BigAccounts(ctx)
	require.NoError(t, err)
	for u := range onceUsers {
		user := domain.UserID(u + 1)
		following, err := store.Following(ctx, user)
		require.NoError(t, err)
		slices.Sort(following)
		var followees []domain.UserID
		rows, err := rig.clean.Query(ctx, `SELECT followee_id FROM follows WHERE follower_id = $1 ORDER BY followee_id`, int64(user))
		require.NoError(t, err)
		for rows.Next() {
			var id int64
			require.NoError(t, rows.Scan(&id))
			followees = append(followees, domain.UserID(id))
		}
		require.NoError(t, rows.Err())
		if !slices.Equal(followees, following) {
			t.Errorf("user %d follows %v in the log, %v in Redis", user, followees, following)
		}

		held, floor, _, ok, err := inbox.ReadAll(ctx, store, user)
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
		// A post in the inbox that is not in the pull feed: its history and
		// the pair's, for the failure's diagnosis.
		for _, x := range minus(haveIDs, wantIDs) {
			var author int64
			var deleted *time.Time
			_ = rig.clean.QueryRow(ctx, `SELECT user_id, deleted_at FROM posts WHERE id = $1`, int64(x)).Scan(&author, &deleted)
			var follows bool
			_ = rig.clean.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM follows WHERE follower_id = $1 AND followee_id = $2)`, int64(user), author).Scan(&follows)
			t.Logf("user %d has post %d in the inbox: author %d, deleted at %v, followed %v, big %v", user, x, author, deleted, follows, slices.Contains(big, domain.UserID(author)))
			_ = rig.log.Read(ctx, events.ReadOptions{StopAtEnd: true, Filters: []string{fmt.Sprintf("ev.%d.*.%d", user, author), fmt.Sprintf("ev.%d.post.%d", author, x)}}, func(r events.Record) error {
				t.Logf("  %d %s %s", r.Seq, r.Subject, r.Type)
				return nil
			})
		}
		if !slices.Equal(wantIDs, haveIDs) {
			t.Errorf("user %d: the inbox above its floor %d is not the pull feed: %d posts missing %v, %d extra %v",
				user, floor, len(minus(wantIDs, haveIDs)), firstOf(minus(wantIDs, haveIDs)), len(minus(haveIDs, wantIDs)), firstOf(minus(haveIDs, wantIDs)))
		}
	}
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
// and every inbox is the pull feed. Messages a node had sent towards the
// projectors when it went are never read; only a runner that notices the gap
// in the sequences reads them again.
func TestNoEventSkippedWhenTheProjectorsNodeOrTheLeaderIsKilled(t *testing.T) {
	c := natscluster.Start(t, natscluster.Config{SyncAlways: true})
	rig := newOnceRig(t, c.URLs(), c.URLs(), 3)
	stopLoad := rig.load(4, 5*time.Millisecond)
	defer stopLoad()
	seed := uint64(time.Now().UnixNano())
	t.Logf("kill points seeded with %d", seed)
	rng := rand.New(rand.NewPCG(seed, 40))
	const kills = 12
	for k := range kills {
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		victim, why := c.ServerOf(rig.projNC), "the projectors' node"
		if k%2 == 1 || victim < 0 {
			victim, why = c.WaitForStreamLeader("FEED_EVENTS", 10*time.Second), "the stream leader"
		}
		t.Logf("kill %d: node %d, %s; %s", k+1, victim, why, rig.positions())
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
	for k := range cuts {
		time.Sleep(time.Duration(50+rng.IntN(250)) * time.Millisecond)
		marker := "HMSG ev."
		if k%2 == 1 {
			marker = "HMSG fanout."
		}
		select {
		case <-proxy.CutOnNext([]byte(marker)):
			t.Logf("cut %d: on %q; %s", k+1, marker, rig.positions())
		case <-time.After(time.Second):
			t.Logf("cut %d: no %q for a second, cut %d connections; %s", k+1, marker, proxy.CutAll(), rig.positions())
		}
	}
	stopLoad()
	rig.check(t, rig.settle(t, time.Minute))
}
