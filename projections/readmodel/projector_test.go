package readmodel_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/projectionstest"
	"github.com/feedproject/feed/projections/readmodel"
)

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// pjDatabase is a migrated database on pg, new for each call.
func pjDatabase(t *testing.T, pg *localstack.Postgres, name string) *pgxpool.Pool {
	t.Helper()
	pool, err := readmodel.OpenPool(context.Background(), localstacktest.DatabaseCopyForTest(t, pg, name), migrations.Schema, 0)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// pjDump renders every read model table, ordered, for comparing states.
func pjDump(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var b strings.Builder
	for _, q := range []string{
		`SELECT id, user_id, caption, created_at, edited_at, deleted_at, like_count, comment_count FROM posts ORDER BY id`,
		`SELECT post_id, position, media_key, content_type, width, height, size FROM post_media ORDER BY post_id, position`,
		`SELECT follower_id, followee_id, created_at FROM follows ORDER BY follower_id, followee_id`,
		`SELECT post_id, user_id FROM likes ORDER BY post_id, user_id`,
		`SELECT id, post_id, user_id, text, created_at FROM comments ORDER BY id`,
	} {
		rows, err := pool.Query(context.Background(), q)
		require.NoError(t, err)
		for rows.Next() {
			vals, err := rows.Values()
			require.NoError(t, err)
			fmt.Fprintln(&b, vals...)
		}
		require.NoError(t, rows.Err())
		b.WriteString("--\n")
	}
	return b.String()
}

// records numbers events as a log would, one second apart.
func records(evs ...events.Event) []events.Record {
	out := make([]events.Record, len(evs))
	for i, ev := range evs {
		env, err := events.NewEnvelope(fmt.Sprintf("e%d", i+1), t0.Add(time.Duration(i)*time.Second), ev)
		if err != nil {
			panic(err)
		}
		out[i] = events.Record{Envelope: env, Seq: uint64(i + 1), Subject: ev.Subject(), Event: ev}
	}
	return out
}

func created(id domain.PostID, user domain.UserID) events.PostCreated {
	return events.PostCreated{PostID: id, UserID: user, Caption: fmt.Sprintf("post %d", id), CreatedAt: domain.IDTime(int64(id)),
		Media: []events.Media{
			{Key: fmt.Sprintf("%064d.png", id), ContentType: "image/png", Width: 10, Height: 20, Size: 100},
			{Key: fmt.Sprintf("%064d.jpg", id), ContentType: "image/jpeg", Width: 30, Height: 40, Size: 200},
		}}
}

func TestProjectorGivenWhenThen(t *testing.T) {
	pg := localstacktest.PostgresForTest(t)
	const p1, p2 = domain.PostID(1 << 30), domain.PostID(1<<30 + 1)
	tests := []struct {
		name  string
		given []events.Event
		then  map[string]string // query → expected rows
	}{
		{
			name:  "a created post with its media, position 0 the thumbnail",
			given: []events.Event{created(p1, 5)},
			then: map[string]string{
				`SELECT user_id, caption, like_count, comment_count, edited_at IS NULL, deleted_at IS NULL FROM posts`: "[5 post 1073741824 0 0 true true]",
				`SELECT position, content_type, width FROM post_media ORDER BY position`:                               "[0 image/png 10] [1 image/jpeg 30]",
			},
		},
		{
			name:  "an edit changes the caption and records when",
			given: []events.Event{created(p1, 5), events.PostEdited{PostID: p1, UserID: 5, Caption: "new", EditedAt: t0.Add(time.Hour)}},
			then:  map[string]string{`SELECT caption, edited_at FROM posts`: "[new " + t0.Add(time.Hour).Local().String() + "]"},
		},
		{
			name: "a deleted post stays deleted: edit, like and comment after it change nothing",
			given: []events.Event{
				created(p1, 5),
				events.PostDeleted{PostID: p1, UserID: 5, DeletedAt: t0},
				events.PostEdited{PostID: p1, UserID: 5, Caption: "zombie", EditedAt: t0},
				events.PostLiked{UserID: 6, PostID: p1},
				events.CommentAdded{CommentID: 99, PostID: p1, UserID: 6, Text: "boo", CreatedAt: t0},
				events.PostDeleted{PostID: p1, UserID: 5, DeletedAt: t0.Add(time.Hour)},
			},
			then: map[string]string{
				`SELECT caption, deleted_at, like_count, comment_count FROM posts`: "[post 1073741824 " + t0.Local().String() + " 0 0]",
				`SELECT count(*) FROM likes`:                                       "[0]",
				`SELECT count(*) FROM comments`:                                    "[0]",
			},
		},
		{
			name: "likes count once per user; unlike of a like never given changes nothing",
			given: []events.Event{
				created(p1, 5), created(p2, 5),
				events.PostLiked{UserID: 6, PostID: p1}, events.PostLiked{UserID: 6, PostID: p1},
				events.PostLiked{UserID: 7, PostID: p1},
				events.PostUnliked{UserID: 7, PostID: p1}, events.PostUnliked{UserID: 8, PostID: p1},
				events.PostUnliked{UserID: 6, PostID: p2},
			},
			then: map[string]string{
				`SELECT id, like_count FROM posts ORDER BY id`: fmt.Sprintf("[%d 1] [%d 0]", p1, p2),
				`SELECT post_id, user_id FROM likes`:           fmt.Sprintf("[%d 6]", p1),
			},
		},
		{
			name:  "comments are kept and counted",
			given: []events.Event{created(p1, 5), events.CommentAdded{CommentID: 100, PostID: p1, UserID: 6, Text: "nice", CreatedAt: t0}},
			then: map[string]string{
				`SELECT comment_count FROM posts`:                 "[1]",
				`SELECT id, post_id, user_id, text FROM comments`: fmt.Sprintf("[100 %d 6 nice]", p1),
			},
		},
		{
			name: "follow, unfollow, follow: followed since the last follow",
			given: []events.Event{
				events.UserFollowed{FollowerID: 1, FolloweeID: 2},
				events.UserUnfollowed{FollowerID: 1, FolloweeID: 2},
				events.UserFollowed{FollowerID: 1, FolloweeID: 2},
			},
			then: map[string]string{`SELECT follower_id, followee_id, created_at FROM follows`: "[1 2 " + t0.Add(2*time.Second).Local().String() + "]"},
		},
		{
			name: "following again keeps the first follow's time",
			given: []events.Event{
				events.UserFollowed{FollowerID: 1, FolloweeID: 2},
				events.UserFollowed{FollowerID: 1, FolloweeID: 2},
			},
			then: map[string]string{`SELECT created_at FROM follows`: "[" + t0.Local().String() + "]"},
		},
		{
			name:  "unfollowing someone not followed changes nothing",
			given: []events.Event{events.UserUnfollowed{FollowerID: 1, FolloweeID: 2}, events.UserFollowed{FollowerID: 3, FolloweeID: 1}, events.UserUnfollowed{FollowerID: 3, FolloweeID: 1}},
			then:  map[string]string{`SELECT count(*) FROM follows`: "[0]"},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			// When: all in one batch, and one event per batch (merging must not
			// change the outcome), and the whole batch again (duplicates).
			oneBatch := pjDatabase(t, pg, fmt.Sprintf("gwt%d_a", i))
			perEvent := pjDatabase(t, pg, fmt.Sprintf("gwt%d_b", i))
			recs := records(tt.given...)
			pa, pb := readmodel.NewProjector(oneBatch, nil), readmodel.NewProjector(perEvent, nil)
			require.NoError(t, pa.Apply(ctx, recs))
			require.NoError(t, pa.Apply(ctx, recs), "a redelivered batch")
			for _, rec := range recs {
				require.NoError(t, pb.Apply(ctx, []events.Record{rec}))
			}
			for q, want := range tt.then {
				assert.Equal(t, want, pjQuery(t, oneBatch, q), "one batch: %s", q)
			}
			assert.Equal(t, pjDump(t, oneBatch), pjDump(t, perEvent), "one batch and one event per batch agree")
			cp, err := pa.Checkpoint(ctx)
			require.NoError(t, err)
			assert.EqualValues(t, len(recs), cp)
		})
	}
}

// TestDuplicatesOfEarlierEvents: a batch plays its events against the rows
// it reads, taking the posts and comments it creates to be new. A duplicate
// of a creation in an earlier batch is not, and such a batch must come out as
// its events applied one by one: the duplicates change nothing and the like
// before the duplicate creation counts (the post was there).
func TestDuplicatesOfEarlierEvents(t *testing.T) {
	ctx := context.Background()
	pg := localstacktest.PostgresForTest(t)
	const p1 = domain.PostID(1 << 30)
	again := created(p1, 5)
	again.Caption = "created again"
	recs := records(
		created(p1, 5),
		events.CommentAdded{CommentID: 100, PostID: p1, UserID: 6, Text: "first", CreatedAt: t0},
		// The second batch.
		events.PostLiked{UserID: 7, PostID: p1},
		again,
		events.CommentAdded{CommentID: 100, PostID: p1, UserID: 8, Text: "again", CreatedAt: t0},
		events.PostEdited{PostID: p1, UserID: 5, Caption: "edited", EditedAt: t0.Add(time.Hour)},
	)
	inTwo, perEvent := pjDatabase(t, pg, "dup_a"), pjDatabase(t, pg, "dup_b")
	pa, pb := readmodel.NewProjector(inTwo, nil), readmodel.NewProjector(perEvent, nil)
	require.NoError(t, pa.Apply(ctx, recs[:2]))
	require.NoError(t, pa.Apply(ctx, recs[2:]))
	for _, rec := range recs {
		require.NoError(t, pb.Apply(ctx, []events.Record{rec}))
	}
	assert.Equal(t, "[edited 1 1]", pjQuery(t, inTwo, `SELECT caption, like_count, comment_count FROM posts`))
	assert.Equal(t, "[100 6 first]", pjQuery(t, inTwo, `SELECT id, user_id, text FROM comments`))
	assert.Equal(t, "[2]", pjQuery(t, inTwo, `SELECT count(*) FROM post_media`))
	assert.Equal(t, pjDump(t, perEvent), pjDump(t, inTwo))
}

// TestTwoInstances runs two projectors on one read model at once, each
// through the whole log in batches of its own sizes: each batch reads the
// rows it is about after taking the checkpoint lock, so whatever the other
// committed in between is seen, and the result is one clean replay's.
func TestTwoInstances(t *testing.T) {
	ctx := context.Background()
	pg := localstacktest.PostgresForTest(t)
	log := pjLog(t)
	workload(t, log, 3000, 5)
	var all []events.Record
	require.NoError(t, log.Read(ctx, events.ReadOptions{StopAtEnd: true, IncludeUnknown: true}, func(r events.Record) error {
		all = append(all, r)
		return nil
	}))
	shared := pjDatabase(t, pg, "shared")
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() {
			p := readmodel.NewProjector(shared, nil)
			if i == 0 {
				// One remembers the rows of its batches (see known): its
				// knowledge must not outlive the other's writes.
				readmodel.SetCatchUpBatch(p, 1)
			}
			rng := rand.New(rand.NewPCG(uint64(i), 9))
			for rest := all; len(rest) > 0 && errs[i] == nil; {
				n := min(len(rest), 1+rng.IntN(200))
				errs[i] = p.Apply(ctx, rest[:n])
				rest = rest[n:]
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	clean := pjDatabase(t, pg, "clean")
	replay(t, log, clean)
	assert.Equal(t, pjDump(t, clean), pjDump(t, shared))
}

func pjQuery(t *testing.T, pool *pgxpool.Pool, q string) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), q)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(t, err)
		out = append(out, fmt.Sprint(vals))
	}
	require.NoError(t, rows.Err())
	return strings.Join(out, " ")
}

func TestFollowMergeIsCounted(t *testing.T) {
	ctx := context.Background()
	pool := pjDatabase(t, localstacktest.PostgresForTest(t), "merge")
	reg := prometheus.NewRegistry()
	p := readmodel.NewProjector(pool, projections.NewMetrics(reg))
	// Flapping: five events of one pair collapse to the last; an unfollow of a
	// pair never followed is dropped as a no-op.
	require.NoError(t, p.Apply(ctx, records(
		events.UserFollowed{FollowerID: 1, FolloweeID: 2},
		events.UserUnfollowed{FollowerID: 1, FolloweeID: 2},
		events.UserFollowed{FollowerID: 1, FolloweeID: 2},
		events.UserUnfollowed{FollowerID: 1, FolloweeID: 2},
		events.UserFollowed{FollowerID: 1, FolloweeID: 2},
		events.UserUnfollowed{FollowerID: 3, FolloweeID: 4},
	)))
	assert.InDelta(t, 4, testutil.ToFloat64(pjCounter(reg, "collapsed")), 0)
	assert.InDelta(t, 1, testutil.ToFloat64(pjCounter(reg, "noop")), 0)
	assert.Equal(t, "[1 2]", pjQuery(t, pool, `SELECT follower_id, followee_id FROM follows`))
}

func pjCounter(reg *prometheus.Registry, how string) prometheus.Collector {
	return prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "feed_projector_follow_events_merged_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "how" && l.GetValue() == how {
						ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("x", "x", nil, nil), prometheus.CounterValue, m.GetCounter().GetValue())
					}
				}
			}
		}
	})
}

// pjLog is a real log on an embedded JetStream.
func pjLog(t *testing.T) *events.Log {
	t.Helper()
	log, err := events.OpenLog(context.Background(), localstacktest.JetStreamForTest(t), events.Config{}, nil)
	require.NoError(t, err)
	t.Cleanup(log.Close)
	return log
}

// workload appends n random events over a few users, including the unusual
// sequences a projector must survive: likes and edits of deleted posts,
// flapping follows, duplicates, comments on unknown posts.
func workload(t *testing.T, log *events.Log, n int, seed uint64) {
	t.Helper()
	require.NoError(t, appendWorkload(context.Background(), log, n, seed, 0))
}

// appendWorkload appends workload's events, one every pace.
func appendWorkload(ctx context.Context, log *events.Log, n int, seed uint64, pace time.Duration) error {
	rng := rand.New(rand.NewPCG(seed, seed))
	ids, err := domain.NewIDGenerator(0)
	if err != nil {
		return err
	}
	var posts []events.PostCreated
	clock := t0
	for i := range n {
		clock = clock.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
		user := domain.UserID(rng.IntN(12) + 1)
		other := domain.UserID(rng.IntN(12) + 1)
		var ev events.Event
		switch k := rng.IntN(100); {
		case k < 20 || len(posts) == 0:
			id, at := ids.Next(clock)
			pc := created(domain.PostID(id), user)
			pc.CreatedAt = at
			pc.Media = pc.Media[:1+rng.IntN(2)]
			posts = append(posts, pc)
			ev = pc
		case k < 28:
			p := posts[rng.IntN(len(posts))]
			ev = events.PostEdited{PostID: p.PostID, UserID: p.UserID, Caption: fmt.Sprintf("edit %d", i), EditedAt: clock}
		case k < 33:
			p := posts[rng.IntN(len(posts))]
			ev = events.PostDeleted{PostID: p.PostID, UserID: p.UserID, DeletedAt: clock}
		case k < 55:
			if user == other {
				other = user%12 + 1
			}
			if rng.IntN(3) == 0 {
				ev = events.UserUnfollowed{FollowerID: user, FolloweeID: other}
			} else {
				ev = events.UserFollowed{FollowerID: user, FolloweeID: other}
			}
		case k < 75:
			ev = events.PostLiked{UserID: user, PostID: posts[rng.IntN(len(posts))].PostID}
		case k < 85:
			ev = events.PostUnliked{UserID: user, PostID: posts[rng.IntN(len(posts))].PostID}
		default:
			id, at := ids.Next(clock)
			post := posts[rng.IntN(len(posts))].PostID
			if rng.IntN(20) == 0 {
				post = 999 // unknown
			}
			ev = events.CommentAdded{CommentID: domain.CommentID(id), PostID: post, UserID: user, Text: fmt.Sprintf("c%d", i), CreatedAt: at}
		}
		if _, err := log.AppendEvent(ctx, fmt.Sprintf("w%d-%d", seed, i), clock, ev); err != nil {
			return err
		}
		time.Sleep(pace)
	}
	return nil
}

// replay builds a read model from sequence 1 with plain reads of the log, in
// batches of random size, independent of the runner under test.
func replay(t *testing.T, log *events.Log, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	p := readmodel.NewProjector(pool, nil)
	rng := rand.New(rand.NewPCG(7, 7))
	var batch []events.Record
	size := 1 + rng.IntN(300)
	require.NoError(t, log.Read(ctx, events.ReadOptions{StopAtEnd: true, IncludeUnknown: true}, func(r events.Record) error {
		batch = append(batch, r)
		if len(batch) == size {
			if err := p.Apply(ctx, batch); err != nil {
				return err
			}
			batch, size = nil, 1+rng.IntN(300)
		}
		return nil
	}))
	if len(batch) > 0 {
		require.NoError(t, p.Apply(ctx, batch))
	}
}

// faulty wraps the projector with the failures of real life.
type faulty struct {
	*readmodel.Projector
	projectionstest.Faults
}

// Send is how a runner hands the projector its batches (it is a
// projections.Pipeliner): the failures are injected there.
func (f *faulty) Send(ctx context.Context, batch []events.Record) <-chan error {
	return f.Faults.Send(ctx, batch, f.Projector.Send)
}

// TestExactlyOnceUnderFailure applies thousands of events through the runner
// while transactions fail half-way, the process "crashes" right after a commit,
// the consumer disappears (redelivery) and Postgres connections are killed;
// the result must equal a clean replay row for row.
func TestExactlyOnceUnderFailure(t *testing.T) {
	pg := localstacktest.PostgresForTest(t)
	log := pjLog(t)
	workload(t, log, 4000, 1)

	live := pjDatabase(t, pg, "live")
	p := readmodel.NewProjector(live, nil)
	// It remembers what its batches leave the rows as, for as long as no
	// failure makes it forget (see known): the rewinds start it again with
	// rows it does not know.
	readmodel.SetCatchUpBatch(p, 1)
	f := &faulty{Projector: p, Faults: projectionstest.Faults{Rng: rand.New(rand.NewPCG(3, 3))}}
	chaos := &projectionstest.Chaos{Rng: rand.New(rand.NewPCG(4, 4)), Pool: live, Log: log, Consumer: projections.ConsumerName(readmodel.ProjectorName)}
	projectionstest.RunUntil(t, log, f, projections.RunnerConfig{BatchSize: 97}, chaos.Step)
	t.Logf("injected: %d aborted transactions, %d crashes after commit, %d killed connections, %d deleted consumers",
		f.Aborted, f.Crashed, chaos.Killed, chaos.Deleted)
	require.Positive(t, f.Aborted+f.Crashed)
	// The last kill may have left idle connections of the pool terminated
	// (the projector retries; the checks below would not): start afresh.
	live.Reset()

	clean := pjDatabase(t, pg, "clean")
	replay(t, log, clean)
	assert.Equal(t, pjDump(t, clean), pjDump(t, live))
	// Counts agree with the rows they count.
	assert.Equal(t, "[0]", pjQuery(t, live, `SELECT count(*) FROM posts p WHERE like_count <> (SELECT count(*) FROM likes l WHERE l.post_id = p.id)`))
	assert.Equal(t, "[0]", pjQuery(t, live, `SELECT count(*) FROM posts p WHERE comment_count <> (SELECT count(*) FROM comments c WHERE c.post_id = p.id)`))
	// No image without its post (no foreign key checks it: migration 3).
	assert.Equal(t, "[0]", pjQuery(t, live, `SELECT count(*) FROM post_media m WHERE NOT EXISTS (SELECT FROM posts p WHERE p.id = m.post_id)`))
}

// TestSentAheadUnderFailure replays the log from an empty read model again
// and again, each time with failures from a different random start: until
// the first, the projector knows every row and sends each batch ahead of
// the one before it (see Projector.Send); the failures hit such pairs. Each
// replay must equal a clean one.
func TestSentAheadUnderFailure(t *testing.T) {
	ctx := context.Background()
	pg := localstacktest.PostgresForTest(t)
	log := pjLog(t)
	workload(t, log, 2000, 11)
	clean := pjDatabase(t, pg, "clean")
	replay(t, log, clean)
	want := pjDump(t, clean)

	pool := pjDatabase(t, pg, "ahead")
	for round := range 5 {
		_, err := pool.Exec(ctx, `TRUNCATE posts, post_media, follows, likes, comments; DELETE FROM projector_checkpoints`)
		require.NoError(t, err)
		p := readmodel.NewProjector(pool, nil)
		readmodel.SetCatchUpBatch(p, 1)
		f := &faulty{Projector: p, Faults: projectionstest.Faults{Rng: rand.New(rand.NewPCG(uint64(round), 12))}}
		chaosRng := rand.New(rand.NewPCG(uint64(round), 13))
		projectionstest.RunUntil(t, log, f, projections.RunnerConfig{BatchSize: 50}, func() {
			if chaosRng.IntN(20) == 0 {
				_, _ = pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
					WHERE datname = current_database() AND pid <> pg_backend_pid()`)
			}
		})
		pool.Reset()
		require.Equal(t, want, pjDump(t, pool), "round %d: %d aborted, %d crashed", round, f.Aborted, f.Crashed)
	}
}

// TestReplayEquivalence drops the live read model and replays it through the
// runner from sequence 1: the tables come back identical.
func TestReplayEquivalence(t *testing.T) {
	ctx := context.Background()
	pg := localstacktest.PostgresForTest(t)
	log := pjLog(t)
	workload(t, log, 3000, 2)
	pool := pjDatabase(t, pg, "replayed")
	projectionstest.RunUntil(t, log, readmodel.NewProjector(pool, nil), projections.RunnerConfig{BatchSize: 13}, nil)
	before := pjDump(t, pool)
	require.NotEqual(t, strings.Repeat("--\n", 5), before, "the workload built something")

	_, err := pool.Exec(ctx, `TRUNCATE posts, post_media, follows, likes, comments; DELETE FROM projector_checkpoints`)
	require.NoError(t, err)
	// The replay remembers every row it writes, and reads none after its
	// first batch (see known).
	p := readmodel.NewProjector(pool, nil)
	readmodel.SetCatchUpBatch(p, 1)
	projectionstest.RunUntil(t, log, p, projections.RunnerConfig{BatchSize: 500}, nil)
	assert.Equal(t, before, pjDump(t, pool))
}

// TestPoisonEventIsDeadLettered makes one event impossible to store: after the
// attempts it goes to the dead-letter stream with its error, is counted, and
// the events after it are applied.
func TestPoisonEventIsDeadLettered(t *testing.T) {
	ctx := context.Background()
	pool := pjDatabase(t, localstacktest.PostgresForTest(t), "poison")
	log := pjLog(t)
	_, err := log.AppendEvent(ctx, "a", t0, created(1<<30, 5))
	require.NoError(t, err)
	poison := created(1<<30+1, 5)
	poison.Caption = "nul \x00 byte" // no Postgres text can hold it
	_, err = log.AppendEvent(ctx, "b", t0, poison)
	require.NoError(t, err)
	_, err = log.AppendEvent(ctx, "c", t0, events.UserFollowed{FollowerID: 1, FolloweeID: 5})
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	metrics := projections.NewMetrics(reg)
	runUntilWithMetrics(t, log, readmodel.NewProjector(pool, metrics), metrics)

	assert.Equal(t, "[1]", pjQuery(t, pool, `SELECT count(*) FROM posts`))
	assert.Equal(t, "[1 5]", pjQuery(t, pool, `SELECT follower_id, followee_id FROM follows`))
	dl, err := log.JetStream().Stream(ctx, projections.DeadLetterStream)
	require.NoError(t, err)
	msg, err := dl.GetLastMsgForSubject(ctx, "deadletter.readmodel.>")
	require.NoError(t, err)
	assert.Equal(t, "deadletter.readmodel.2", msg.Subject)
	assert.Contains(t, string(msg.Data), `"seq":2`)
	assert.Contains(t, string(msg.Data), "post.created.v1")
	assert.Contains(t, string(msg.Data), `"error":`)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "feed_projector_dead_letters_total" {
			found = true
			assert.InDelta(t, 1, mf.GetMetric()[0].GetCounter().GetValue(), 0)
		}
	}
	assert.True(t, found)
}

// TestUndecodableAndUnknownEvents: a body that is not an envelope is a poison
// event, dead-lettered at once with its bytes; an event of a type this build
// does not know is skipped and counted; the events around both are applied.
func TestUndecodableAndUnknownEvents(t *testing.T) {
	ctx := context.Background()
	pool := pjDatabase(t, localstacktest.PostgresForTest(t), "undecodable")
	nc, err := nats.Connect(localstacktest.NATSForTest(t).ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	logMetrics := events.NewMetrics(prometheus.NewRegistry())
	log, err := events.OpenLog(ctx, js, events.Config{}, logMetrics)
	require.NoError(t, err)
	t.Cleanup(log.Close)

	const post = domain.PostID(1 << 30)
	_, err = log.AppendEvent(ctx, "a", t0, created(post, 5))
	require.NoError(t, err)
	subject := events.Subject(6, events.KindLike, int64(post))
	_, err = js.Publish(ctx, subject, []byte("not an envelope"))
	require.NoError(t, err)
	future, err := json.Marshal(events.Envelope{ID: "b", Type: "post.boosted.v9", OccurredAt: t0, Actor: 6, Payload: json.RawMessage(`{"post_id":"1"}`)})
	require.NoError(t, err)
	_, err = js.Publish(ctx, subject, future)
	require.NoError(t, err)
	_, err = log.AppendEvent(ctx, "c", t0, events.PostLiked{UserID: 6, PostID: post})
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	metrics := projections.NewMetrics(reg)
	runUntilWithMetrics(t, log, readmodel.NewProjector(pool, metrics), metrics)

	assert.Equal(t, "[1]", pjQuery(t, pool, `SELECT like_count FROM posts`))
	assert.InDelta(t, 1, logMetrics.UnknownTypes(), 0)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	deadLetters := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "feed_projector_dead_letters_total" {
			deadLetters = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	assert.InDelta(t, 1, deadLetters, 0)
	dl, err := log.JetStream().Stream(ctx, projections.DeadLetterStream)
	require.NoError(t, err)
	msg, err := dl.GetLastMsgForSubject(ctx, "deadletter.readmodel.>")
	require.NoError(t, err)
	assert.Equal(t, "deadletter.readmodel.2", msg.Subject)
	assert.Contains(t, string(msg.Data), `"event":"not an envelope"`)
}

func runUntilWithMetrics(t *testing.T, log *events.Log, p projections.Projector, m *projections.Metrics) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := projections.NewRunner(log, p, projections.RunnerConfig{FetchWait: 100 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}, m, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	head, err := log.Head(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.Position() >= head }, 30*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

// TestLiveEventsAreNotHeldForABatch: a caught-up projector applies a single new
// event promptly, rather than waiting for a full batch or the fetch wait.
func TestLiveEventsAreNotHeldForABatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := pjDatabase(t, localstacktest.PostgresForTest(t), "live")
	log := pjLog(t)
	r := projections.NewRunner(log, readmodel.NewProjector(pool, nil),
		projections.RunnerConfig{BatchSize: 1000, FetchWait: 5 * time.Second}, nil, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, r.Running, 10*time.Second, 10*time.Millisecond)
	time.Sleep(100 * time.Millisecond) // caught up and waiting
	for i := range 3 {
		res, err := log.AppendEvent(ctx, fmt.Sprintf("live-%d", i), t0, events.UserFollowed{FollowerID: domain.UserID(i + 1), FolloweeID: 99})
		require.NoError(t, err)
		start := time.Now()
		require.Eventually(t, func() bool { return r.Position() >= res.Seq }, 5*time.Second, time.Millisecond)
		assert.Less(t, time.Since(start), time.Second, "event %d waited for a batch", i)
	}
	cancel()
	require.NoError(t, <-done)
}
