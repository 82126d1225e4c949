package readmodel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/activity"
	"github.com/feedproject/feed/projections/readmodel"
)

// BenchmarkReplay measures, in one run: the events/s the read model projector
// applies during a full replay of 100 000 mixed events, the raw rate at which
// an ordered consumer reads the same stream, and their ratio; with the CPU
// time the replay took in this process, in Postgres and in NATS; then the
// same replay by the activity projector, its ratio to the same raw rate and
// the CPU time it took in this process and in Postgres. NATS runs in
// a process of its own, as the service runs it (`feed nats`, this test binary
// here). FEED_BENCH_CPUPROFILE names a file for a CPU profile of the replay
// alone.
//
//	go test -run '^$' -bench BenchmarkReplay -benchtime 1x ./projections/readmodel
func BenchmarkReplay(b *testing.B) {
	const n = 100_000
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	ns, err := localstack.StartNATSProcess(ctx, []string{os.Args[0], "nats"}, localstack.NATSConfig{Dir: b.TempDir()}, quiet)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = ns.Stop() }()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	log, err := events.OpenLog(ctx, js, events.Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	publishMixed(b, js, n)

	pg := localstacktest.PostgresForTest(b)
	for b.Loop() {
		raw := rawOrderedRead(b, js, log.Stream(), n)
		pool, err := readmodel.OpenPool(ctx, pg.URL(), migrations.Schema, 0)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `TRUNCATE posts, post_media, follows, likes, comments; DELETE FROM projector_checkpoints`); err != nil {
			b.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		r := projections.NewRunner(log, readmodel.NewProjector(pool, nil), projections.RunnerConfig{BatchSize: benchBatch()}, nil, quiet)
		done := make(chan error, 1)
		stopProfile := startProfile(b)
		goCPU, pgCPU, natsCPU := processCPU(b, os.Getpid(), false), processCPU(b, pg.PID(), true), processCPU(b, ns.PID(), false)
		start := time.Now()
		go func() { done <- r.Run(rctx) }()
		for r.Position() < n {
			time.Sleep(5 * time.Millisecond)
		}
		applied := float64(n) / time.Since(start).Seconds()
		goCPU, pgCPU, natsCPU = processCPU(b, os.Getpid(), false)-goCPU, processCPU(b, pg.PID(), true)-pgCPU, processCPU(b, ns.PID(), false)-natsCPU
		stopProfile()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		pool.Close()
		act, actGo, actPG := activityReplay(b, log, pg.URL(), pg.PID(), uint64(n))
		b.ReportMetric(applied, "applied-events/s")
		b.ReportMetric(raw, "raw-read-events/s")
		b.ReportMetric(applied/raw, "ratio")
		b.ReportMetric(goCPU.Seconds(), "go-cpu-s")
		b.ReportMetric(pgCPU.Seconds(), "postgres-cpu-s")
		b.ReportMetric(natsCPU.Seconds(), "nats-cpu-s")
		b.ReportMetric(act, "activity-events/s")
		b.ReportMetric(act/raw, "activity-ratio")
		b.ReportMetric(actGo.Seconds(), "activity-go-cpu-s")
		b.ReportMetric(actPG.Seconds(), "activity-postgres-cpu-s")
		fmt.Fprintf(os.Stderr, "replay of %d events: projector %.0f events/s, raw ordered read %.0f events/s, ratio %.2f; CPU: Go %.2fs, Postgres %.2fs, NATS %.2fs; activity %.0f events/s, ratio %.2f, CPU: Go %.2fs, Postgres %.2fs\n",
			n, applied, raw, applied/raw, goCPU.Seconds(), pgCPU.Seconds(), natsCPU.Seconds(), act, act/raw, actGo.Seconds(), actPG.Seconds())
	}
}

// activityReplay is the events/s of the activity projector replaying the
// first n events of log into an emptied activity, and the CPU time it took
// in this process and in Postgres (pgPID).
func activityReplay(b *testing.B, log *events.Log, url string, pgPID int, n uint64) (rate float64, goCPU, pgCPU time.Duration) {
	ctx := context.Background()
	pool, err := readmodel.OpenPool(ctx, url, migrations.ActivitySchema, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `TRUNCATE posts, items; DELETE FROM projector_checkpoints`); err != nil {
		b.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	r := projections.NewRunner(log, activity.NewProjector(pool, nil, activity.Config{}), projections.RunnerConfig{BatchSize: benchBatch()}, nil, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	goCPU, pgCPU = processCPU(b, os.Getpid(), false), processCPU(b, pgPID, true)
	start := time.Now()
	go func() { done <- r.Run(rctx) }()
	for r.Position() < n {
		time.Sleep(5 * time.Millisecond)
	}
	rate = float64(n) / time.Since(start).Seconds()
	goCPU, pgCPU = processCPU(b, os.Getpid(), false)-goCPU, processCPU(b, pgPID, true)-pgCPU
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return rate, goCPU, pgCPU
}

// publishMixed appends n events in a realistic mix: a fifth posts, then
// follows and unfollows, likes, comments, edits and deletes.
func publishMixed(b *testing.B, js jetstream.JetStream, n int) {
	rng := rand.New(rand.NewPCG(1, 2))
	ids, _ := domain.NewIDGenerator(0)
	clock := t0
	var posts []events.PostCreated
	for i := range n {
		clock = clock.Add(time.Duration(rng.IntN(40)) * time.Millisecond)
		user := domain.UserID(rng.IntN(2000) + 1)
		other := domain.UserID(rng.IntN(2000) + 1)
		if other == user {
			other = user%2000 + 1
		}
		var ev events.Event
		switch k := rng.IntN(100); {
		case k < 20 || len(posts) == 0:
			id, at := ids.Next(clock)
			pc := created(domain.PostID(id), user)
			pc.CreatedAt = at
			posts = append(posts, pc)
			ev = pc
		case k < 45:
			ev = events.UserFollowed{FollowerID: user, FolloweeID: other}
		case k < 50:
			ev = events.UserUnfollowed{FollowerID: user, FolloweeID: other}
		case k < 75:
			ev = events.PostLiked{UserID: user, PostID: posts[rng.IntN(len(posts))].PostID}
		case k < 80:
			ev = events.PostUnliked{UserID: user, PostID: posts[rng.IntN(len(posts))].PostID}
		case k < 92:
			id, at := ids.Next(clock)
			ev = events.CommentAdded{CommentID: domain.CommentID(id), PostID: posts[rng.IntN(len(posts))].PostID, UserID: user, Text: "nice one", CreatedAt: at}
		case k < 97:
			p := posts[rng.IntN(len(posts))]
			ev = events.PostEdited{PostID: p.PostID, UserID: p.UserID, Caption: "edited", EditedAt: clock}
		default:
			p := posts[rng.IntN(len(posts))]
			ev = events.PostDeleted{PostID: p.PostID, UserID: p.UserID, DeletedAt: clock}
		}
		env, err := events.NewEnvelope(fmt.Sprintf("bench-%d", i), clock, ev)
		if err != nil {
			b.Fatal(err)
		}
		data, _ := json.Marshal(env)
		m := nats.NewMsg(ev.Subject())
		m.Data = data
		m.Header.Set(jetstream.MsgIDHeader, env.ID)
		m.Header.Set(events.TypeHeader, env.Type)
		// A busy machine takes a while to store 4 096 messages.
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute)); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishes not acknowledged")
	}
}

// rawOrderedRead is the limit: an ordered consumer reading the whole stream and
// doing nothing with it.
func rawOrderedRead(b *testing.B, js jetstream.JetStream, stream string, n int) float64 {
	ctx := context.Background()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	it, err := cons.Messages()
	if err != nil {
		b.Fatal(err)
	}
	defer it.Stop()
	start := time.Now()
	for range n {
		if _, err := it.Next(); err != nil {
			b.Fatal(err)
		}
	}
	return float64(n) / time.Since(start).Seconds()
}

// startProfile writes a CPU profile of the replay alone (not of the
// publishing and the raw read) to FEED_BENCH_CPUPROFILE, when set.
func startProfile(b *testing.B) (stop func()) {
	path := os.Getenv("FEED_BENCH_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}

// processCPU is the CPU time pid has used so far (Linux), with that of its
// children (live ones and those it waited for) if children is set: a
// Postgres server's work is done by its backends.
func processCPU(b *testing.B, pid int, children bool) time.Duration {
	ticks := func(stat string, fields ...int) (sum int64, ppid int) {
		// "pid (comm) state ppid ...": comm may hold spaces, so fields are
		// counted after its closing parenthesis.
		f := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:])
		ppid, _ = strconv.Atoi(f[1])
		for _, i := range fields {
			v, _ := strconv.ParseInt(f[i-3], 10, 64)
			sum += v
		}
		return sum, ppid
	}
	const utime, stime, cutime, cstime = 14, 15, 16, 17
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	total, _ := ticks(string(stat), utime, stime)
	if children {
		waited, _ := ticks(string(stat), cutime, cstime)
		total += waited
		procs, _ := os.ReadDir("/proc")
		for _, p := range procs {
			stat, err := os.ReadFile("/proc/" + p.Name() + "/stat")
			if err != nil {
				continue // not a process, or gone
			}
			if t, ppid := ticks(string(stat), utime, stime); ppid == pid {
				total += t
			}
		}
	}
	const hz = 100 // USER_HZ on Linux
	return time.Duration(total) * time.Second / hz
}

// benchBatch is the runner's batch size, FEED_BENCH_BATCH to vary it.
func benchBatch() int {
	n, _ := strconv.Atoi(os.Getenv("FEED_BENCH_BATCH"))
	return n
}
