package inbox_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

const (
	// benchChunk is how many items one inbox.Apply call of an applier gets:
	// an earlier default of PlannerConfig.ItemsPerMessage, kept so that the
	// figures compare.
	benchChunk = 2000
	// setupChunk is how many inboxes one setup call materialises: each takes
	// some 3.7 ms of Redis when full, and a pipeline must finish within the
	// client's read timeout.
	setupChunk = 200
	// benchEntries is about how many inbox entries one measurement writes: the
	// posts of the case's authors are fanned out one after another until then
	// (each at most benchMaxPosts times, so that the inboxes of 20 posts stay
	// below the cap over all the measurements). A measurement then lasts
	// about a second; of a single fan-out to 50 000 followers (some 0.2 s),
	// the ratio varied from 0.27 to 0.63 between measurements of one run, and
	// of 40 posts to 10 followers (400 entries, 6 ms), from 0.37 to 0.73.
	benchEntries  = 200_000
	benchMaxPosts = 40
	// benchPairs is how many times each case measures the raw limit and the
	// appliers, alternating which goes first; the medians are printed, so one
	// measurement disturbed by the rest of the machine does not make the
	// figure.
	benchPairs = 5
)

// benchRedis starts a Redis of the benchmark's own, configured as in
// production (inboxes stay listpacks), and returns a client of it.
func benchRedis(b *testing.B) *redis.Client {
	b.Helper()
	r := localstacktest.RedisForTest(b)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	b.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.ConfigSet(context.Background(), "zset-max-listpack-entries", "1024").Err(); err != nil {
		b.Fatal(err)
	}
	return rdb
}

// benchPosts hands out realistic (time-ordered, 49-bit) post ids, each newer
// than the last.
type benchPosts struct {
	gen   *domain.IDGenerator
	clock time.Time
}

func newBenchPosts(b *testing.B) *benchPosts {
	b.Helper()
	gen, err := domain.NewIDGenerator(3)
	if err != nil {
		b.Fatal(err)
	}
	return &benchPosts{gen: gen, clock: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
}

func (p *benchPosts) next() domain.PostID {
	p.clock = p.clock.Add(1500 * time.Millisecond)
	id, _ := p.gen.Next(p.clock)
	return domain.PostID(id)
}

func (p *benchPosts) take(n int) []domain.PostID {
	ids := make([]domain.PostID, n)
	for i := range ids {
		ids[i] = p.next()
	}
	return ids
}

// applyChunks applies each partition's chunks the way the appliers do: one
// goroutine per partition, one chunk (message) at a time. It returns the
// items applied.
func applyChunks(ctx context.Context, store *feeds.Store, parts [][][]inbox.Item) (int64, error) {
	var applied atomic.Int64
	var g errgroup.Group
	for _, chunks := range parts {
		g.Go(func() error {
			for _, c := range chunks {
				n, err := inbox.Apply(ctx, store, c)
				if err != nil {
					return err
				}
				applied.Add(int64(n))
			}
			return nil
		})
	}
	err := g.Wait()
	return applied.Load(), err
}

// byPartition splits work by recipient partition and chunks each partition's
// share, as Planner.publish does, chunk items a message.
func byPartition[T any](work []T, recipient func(T) domain.UserID, partitions, chunk int) [][][]T {
	parts := make([][]T, partitions)
	for _, w := range work {
		p := fanout.Partition(recipient(w), partitions)
		parts[p] = append(parts[p], w)
	}
	out := make([][][]T, partitions)
	for p, share := range parts {
		out[p] = slices.Collect(slices.Chunk(share, chunk))
	}
	return out
}

func itemRecipient(it inbox.Item) domain.UserID { return it.Recipient }

func self(u domain.UserID) domain.UserID { return u }

// rawScore scores a post in a raw key as inboxes do, newest first: a ZADD
// into a full listpack costs several times more when the new entry goes at its
// tail, so the raw limit pays what a push pays.
func rawScore(p domain.PostID) float64 { return float64(domain.MaxID - int64(p)) }

func rawKey(u domain.UserID) string { return "bench:raw:{" + strconv.FormatInt(int64(u), 10) + "}" }

// rawZAdd is the limit a push is measured against: ZADD key score member into
// each follower's own key, pipelined in the same chunks and partitions, from
// the same client.
func rawZAdd(ctx context.Context, rdb *redis.Client, parts [][][]domain.UserID, post domain.PostID) error {
	member := strconv.FormatInt(int64(post), 10)
	var g errgroup.Group
	for _, chunks := range parts {
		g.Go(func() error {
			for _, c := range chunks {
				pipe := rdb.Pipeline()
				for _, u := range c {
					pipe.ZAdd(ctx, rawKey(u), redis.Z{Score: rawScore(post), Member: member})
				}
				if _, err := pipe.Exec(ctx); err != nil {
					return fmt.Errorf("raw zadd: %w", err)
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// BenchmarkFanout measures, in one run on one Redis, the inbox entries per
// second the appliers write with inbox.Apply while fanning out a post of
// an author with 10, 1 000 and 50 000 followers, every follower's inbox
// materialised (20 posts; and, for 1 000 followers, full at 500 so every push
// also trims), the work split and chunked as the planner does (2 000 items a
// message) and applied as the appliers do (each partition one message at a
// time), with 1 partition and with 4 in parallel; next to the raw limit, the
// same chunks as pipelined ZADD key score member into as many distinct keys of
// the same size, from the same client and as many goroutines; and their ratio
// (target >= 0.5). Each post is fanned out on its own, one after another:
// each author posts benchEntries/(authors x followers) times (at most
// benchMaxPosts), in turn, so that one measurement is long enough to time.
// Authors of 10 followers are 200, with followers of their own: 40 posts of
// one (400 entries) made a measurement of a few milliseconds. Redis's own CPU time per entry (INFO
// cpu) is printed beside each rate: it tells the server's cost from the
// client's. Each case is measured benchPairs times, raw and appliers in
// alternating order, and the medians are printed with each pair's ratio.
// (With the default BigThreshold of 10 000 an author of 50 000 followers is a
// big account whose posts are not pushed; the row shows what the appliers
// could do if they were.)
//
//	go test -run '^$' -bench BenchmarkFanout -benchtime 1x ./projections/feeds/inbox
func BenchmarkFanout(b *testing.B) {
	rdb := benchRedis(b)
	store := feeds.NewStore(rdb, feeds.Config{})
	posts := newBenchPosts(b)
	old := posts.take(store.Config().InboxCap)
	seq := uint64(1)
	fmt.Fprintf(os.Stderr, "%9s %7s %5s %5s %5s | %12s %9s | %12s %9s | %5s\n",
		"followers", "authors", "inbox", "parts", "posts", "apply entr/s", "redis µs", "raw zadd/s", "redis µs", "ratio")
	cases := []struct{ followers, authors, inbox int }{{10, 200, 20}, {1000, 1, 20}, {50_000, 1, 20}, {1000, 1, 500}}
	for ci, c := range cases {
		b.Run(fmt.Sprintf("followers=%d/inbox=%d", c.followers, c.inbox), func(b *testing.B) {
			// Each author's followers, all of them distinct.
			audiences := make([][]domain.UserID, c.authors)
			var followers []domain.UserID
			for a := range audiences {
				for range c.followers {
					followers = append(followers, domain.UserID((ci+1)*1_000_000+len(followers)+1))
				}
				audiences[a] = followers[len(followers)-c.followers:]
			}
			setupFollowers(b, rdb, store, followers, old[len(old)-c.inbox:], seq)
			if c.inbox == store.Config().InboxCap {
				fillPastCap(b, rdb, store, followers, posts, &seq)
			}
			rounds := max(1, min(benchMaxPosts, benchEntries/len(followers)))
			for _, partitions := range []int{1, 4} {
				b.Run(fmt.Sprintf("partitions=%d", partitions), func(b *testing.B) {
					for b.Loop() {
						var raws, applies []rate
						var ratios []float64
						for pair := range benchPairs {
							raw, apply := fanoutPair(b, rdb, store, posts, &seq, audiences, rounds, partitions, pair%2 == 1)
							raws, applies = append(raws, raw), append(applies, apply)
							ratios = append(ratios, apply.rate/raw.rate)
						}
						raw, apply, ratio := reportFanout(b, raws, applies, ratios)
						fmt.Fprintf(os.Stderr, "%9d %7d %5d %5d %5d | %12.0f %9.2f | %12.0f %9.2f | %5.2f  (%s)\n",
							c.followers, c.authors, c.inbox, partitions, rounds, apply.rate, apply.redisCPU, raw.rate, raw.redisCPU, ratio, fmtRatios(ratios))
					}
				})
			}
		})
	}
}

// BenchmarkFanoutBurst measures what a planner batch of several posts to the
// same followers becomes: 1 000 followers with full inboxes (500) receive bursts
// of two and of ten posts, each burst's pushes sorted by recipient as the
// planner sends them (so an applier finds each recipient's pushes together and
// puts them at once) and applied as in BenchmarkFanout; next to the raw limit,
// the same entries as pipelined single-member ZADDs into keys laid out the same
// way, in the same order, chunks and partitions. 200 000 entries a
// measurement. Runs of two or three pushes are what the bench's soak gives each
// recipient under load (its planner's batches of some 30 events), so a run's
// fixed cost weighs most in the burst of two.
//
//	go test -run '^$' -bench BenchmarkFanoutBurst -benchtime 1x ./projections/feeds/inbox
func BenchmarkFanoutBurst(b *testing.B) {
	const (
		followersN = 1000
		entriesN   = 200_000
	)
	rdb := benchRedis(b)
	store := feeds.NewStore(rdb, feeds.Config{})
	posts := newBenchPosts(b)
	seq := uint64(1)
	followers := make([]domain.UserID, followersN)
	for i := range followers {
		followers[i] = domain.UserID(9_000_000 + i + 1)
	}
	old := posts.take(store.Config().InboxCap)
	setupFollowers(b, rdb, store, followers, old, seq)
	type entry struct {
		user domain.UserID
		post domain.PostID
	}
	for _, c := range []struct{ burst, partitions int }{{2, 1}, {2, 4}, {10, 1}, {10, 4}} {
		burst, partitions := c.burst, c.partitions
		bursts := entriesN / (burst * followersN)
		b.Run(fmt.Sprintf("burst=%d/partitions=%d", burst, partitions), func(b *testing.B) {
			for b.Loop() {
				var raws, applies []rate
				var ratios []float64
				for pair := range benchPairs {
					var work [][][][]inbox.Item
					var raw [][][][]entry
					for range bursts {
						var items []inbox.Item
						var entries []entry
						for range burst {
							seq++
							p := posts.next()
							for _, f := range followers {
								items = append(items, inbox.Item{Recipient: f, Seq: seq, Op: inbox.OpPush, Posts: []domain.PostID{p}})
								entries = append(entries, entry{f, p})
							}
						}
						slices.SortStableFunc(items, func(a, b inbox.Item) int { return cmp.Compare(a.Recipient, b.Recipient) })
						slices.SortStableFunc(entries, func(a, b entry) int { return cmp.Compare(a.user, b.user) })
						work = append(work, byPartition(items, itemRecipient, partitions, benchChunk))
						raw = append(raw, byPartition(entries, func(e entry) domain.UserID { return e.user }, partitions, benchChunk))
					}
					n := float64(bursts * burst * followersN)
					measureRaw := func() rate {
						// Back to 500 entries first: grown past
						// zset-max-listpack-entries, a key would turn into a
						// skiplist, which adds in a different time.
						setupRaw(b, rdb, followers, old, 1)
						return measure(b, rdb, n, func(ctx context.Context) error {
							for _, parts := range raw {
								var g errgroup.Group
								for _, chunks := range parts {
									g.Go(func() error {
										for _, c := range chunks {
											pipe := rdb.Pipeline()
											for _, e := range c {
												pipe.ZAdd(ctx, rawKey(e.user), redis.Z{Score: rawScore(e.post), Member: strconv.FormatInt(int64(e.post), 10)})
											}
											if _, err := pipe.Exec(ctx); err != nil {
												return fmt.Errorf("raw zadd: %w", err)
											}
										}
										return nil
									})
								}
								if err := g.Wait(); err != nil {
									return err
								}
							}
							return nil
						})
					}
					measureApply := func() rate {
						return measure(b, rdb, n, func(ctx context.Context) error {
							return applyAll(ctx, store, work, int64(burst*followersN))
						})
					}
					r, a := inTurn(pair%2 == 1, measureRaw, measureApply)
					raws, applies = append(raws, r), append(applies, a)
					ratios = append(ratios, a.rate/r.rate)
				}
				raw, apply, ratio := reportFanout(b, raws, applies, ratios)
				fmt.Fprintf(os.Stderr, "burst of %d posts to %d full inboxes, %d partitions | %12.0f entries/s %9.2f µs | raw %12.0f zadd/s %9.2f µs | %5.2f  (%s)\n",
					burst, followersN, partitions, apply.rate, apply.redisCPU, raw.rate, raw.redisCPU, ratio, fmtRatios(ratios))
			}
		})
	}
}

// fanoutPair fans out, rounds times, a new post of each author to its
// followers (audiences), once as raw ZADDs and once through the appliers
// (first if applyFirst), and returns both rates.
func fanoutPair(b *testing.B, rdb *redis.Client, store *feeds.Store, posts *benchPosts, seq *uint64, audiences [][]domain.UserID, rounds, partitions int, applyFirst bool) (raw, apply rate) {
	b.Helper()
	// Each post is fanned out on its own: the authors' posts of a round in
	// turn.
	n := rounds * len(audiences)
	post := make([]domain.PostID, n)
	keys := make([][][][]domain.UserID, n)
	work := make([][][][]inbox.Item, n)
	for r := range n {
		followers := audiences[r%len(audiences)]
		*seq++
		post[r] = posts.next()
		items := make([]inbox.Item, len(followers))
		for i, f := range followers {
			items[i] = inbox.Item{Recipient: f, Seq: *seq, Op: inbox.OpPush, Posts: []domain.PostID{post[r]}}
		}
		work[r] = byPartition(items, itemRecipient, partitions, benchChunk)
		keys[r] = byPartition(followers, self, partitions, benchChunk)
	}
	followers := len(audiences[0])
	entries := float64(n * followers)

	measureRaw := func() rate {
		return measure(b, rdb, entries, func(ctx context.Context) error {
			for r, p := range post {
				if err := rawZAdd(ctx, rdb, keys[r], p); err != nil {
					return err
				}
			}
			return nil
		})
	}
	measureApply := func() rate {
		return measure(b, rdb, entries, func(ctx context.Context) error {
			return applyAll(ctx, store, work, int64(followers))
		})
	}
	return inTurn(applyFirst, measureRaw, measureApply)
}

// inTurn measures raw and apply, apply first if applyFirst, and returns both.
func inTurn(applyFirst bool, raw, apply func() rate) (rate, rate) {
	if applyFirst {
		a := apply()
		return raw(), a
	}
	r := raw()
	return r, apply()
}

// reportFanout reports the medians of a case's measurements as the
// benchmark's metrics and returns them.
func reportFanout(b *testing.B, raws, applies []rate, ratios []float64) (raw, apply rate, ratio float64) {
	raw, apply, ratio = medianRate(raws), medianRate(applies), median(ratios)
	b.ReportMetric(apply.rate, "entries/s")
	b.ReportMetric(raw.rate, "raw-zadd/s")
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(apply.redisCPU, "redis-µs/entry")
	b.ReportMetric(raw.redisCPU, "raw-redis-µs/zadd")
	return raw, apply, ratio
}

// applyAll applies each fan-out's work in turn, as the appliers do, and fails
// unless each applied want items: every follower's inbox must take the posts.
func applyAll(ctx context.Context, store *feeds.Store, work [][][][]inbox.Item, want int64) error {
	for _, w := range work {
		applied, err := applyChunks(ctx, store, w)
		if err != nil {
			return err
		}
		if applied != want {
			return fmt.Errorf("%d of %d pushes applied: every follower's inbox must take the posts", applied, want)
		}
	}
	return nil
}

// median is the middle of xs (the mean of the two middle ones if even).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// medianRate is the median of the rates and of the CPU times, each on its own.
func medianRate(rs []rate) rate {
	var rates, cpus []float64
	for _, r := range rs {
		rates, cpus = append(rates, r.rate), append(cpus, r.redisCPU)
	}
	return rate{rate: median(rates), redisCPU: median(cpus)}
}

func fmtRatios(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strings.Join(parts, " ")
}

// rate is what one measured run achieved.
type rate struct {
	rate     float64 // entries per second
	redisCPU float64 // Redis's CPU time per entry, µs
}

// measure runs fn, which writes entries, and returns its rate and the CPU time
// Redis spent per entry meanwhile.
func measure(b *testing.B, rdb *redis.Client, entries float64, fn func(context.Context) error) rate {
	b.Helper()
	cpu0 := redisCPU(b, rdb)
	start := time.Now()
	if err := fn(context.Background()); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	cpu := redisCPU(b, rdb) - cpu0
	return rate{rate: entries / elapsed.Seconds(), redisCPU: cpu * 1e6 / entries}
}

// redisCPU is the CPU time, in seconds, the Redis server has used.
func redisCPU(b *testing.B, rdb *redis.Client) float64 {
	b.Helper()
	info, err := rdb.InfoMap(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		v, err := strconv.ParseFloat(info["CPU"][k], 64)
		if err != nil {
			b.Fatalf("INFO cpu %s: %v", k, err)
		}
		total += v
	}
	return total
}

// setupFollowers materialises each follower's inbox with posts through
// inbox.Apply and gives each a raw key holding the same members. One partition
// does it: a message materialising 200 full inboxes takes about a second (some
// 3.7 ms of Redis per inbox), and four at once outlast go-redis's 3 s read
// timeout, whose silent retry of the pipeline finds the inboxes made and
// counts them skipped.
func setupFollowers(b *testing.B, rdb *redis.Client, store *feeds.Store, followers []domain.UserID, posts []domain.PostID, seq uint64) {
	b.Helper()
	ctx := context.Background()
	items := make([]inbox.Item, len(followers))
	for i, f := range followers {
		items[i] = inbox.Item{Recipient: f, Seq: seq, Op: inbox.OpMaterialise, Posts: posts}
	}
	applied, err := applyChunks(ctx, store, byPartition(items, itemRecipient, 1, setupChunk))
	if err != nil {
		b.Fatal(err)
	}
	if applied != int64(len(followers)) {
		b.Fatalf("%d of %d inboxes materialised", applied, len(followers))
	}
	setupRaw(b, rdb, followers, posts, seq)
}

// fillPastCap pushes each follower's full inbox a random number of posts
// past its cap, fewer than a segment's worth, and the same posts into its raw
// key: an inbox is trimmed once it would hold a segment more than its cap,
// so inboxes that are all at the cap would all be trimmed by the same push,
// and a measurement would either pay for none of the trims or for all of
// them. Spread out, a measurement of k pushes into each pays for the trims of
// k in every segment's worth, as a steady stream does.
func fillPastCap(b *testing.B, rdb *redis.Client, store *feeds.Store, followers []domain.UserID, posts *benchPosts, seq *uint64) {
	b.Helper()
	ctx := context.Background()
	size := min(store.Config().SegmentSize, store.Config().InboxCap)
	rng := rand.New(rand.NewPCG(uint64(len(followers)), uint64(followers[0])))
	var items []inbox.Item
	for _, f := range followers {
		fill := posts.take(rng.IntN(size))
		for j, p := range fill {
			items = append(items, inbox.Item{Recipient: f, Seq: *seq + uint64(j) + 1, Op: inbox.OpPush, Posts: []domain.PostID{p}})
		}
	}
	*seq += uint64(size)
	applied, err := applyChunks(ctx, store, byPartition(items, itemRecipient, 1, setupChunk))
	if err != nil {
		b.Fatal(err)
	}
	if applied != int64(len(items)) {
		b.Fatalf("%d of %d pushes past the cap applied", applied, len(items))
	}
	if err := rawZAddItems(ctx, rdb, items); err != nil {
		b.Fatal(err)
	}
}

// setupRaw gives each follower a raw key holding posts and the two specials,
// as setupFollowers does for an inbox, replacing what it held.
func setupRaw(b *testing.B, rdb *redis.Client, followers []domain.UserID, posts []domain.PostID, seq uint64) {
	b.Helper()
	ctx := context.Background()
	members := make([]redis.Z, 0, len(posts)+2)
	members = append(members, redis.Z{Score: -1, Member: "f"}, redis.Z{Score: -float64(seq + 1), Member: "s"})
	for _, p := range posts {
		members = append(members, redis.Z{Score: rawScore(p), Member: strconv.FormatInt(int64(p), 10)})
	}
	for c := range slices.Chunk(followers, benchChunk) {
		pipe := rdb.Pipeline()
		for _, f := range c {
			pipe.Del(ctx, rawKey(f))
			pipe.ZAdd(ctx, rawKey(f), members...)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInboxMemory measures, on one Redis configured as in production, the
// memory an inbox entry takes: 1 000 inboxes of 500 posts are materialised
// through inbox.Apply, and the growth of INFO's used_memory per post is printed
// next to one inbox's MEMORY USAGE per post (target <= 24 bytes).
//
//	go test -run '^$' -bench BenchmarkInboxMemory -benchtime 1x ./projections/feeds/inbox
func BenchmarkInboxMemory(b *testing.B) {
	const inboxes = 1000
	ctx := context.Background()
	rdb := benchRedis(b)
	store := feeds.NewStore(rdb, feeds.Config{})
	size := store.Config().InboxCap
	posts := newBenchPosts(b)
	for round := 0; b.Loop(); round++ {
		// Each iteration its own users and posts, so each adds a full set.
		all := posts.take(size * 4)
		before := usedMemory(b, rdb)
		items := make([]inbox.Item, inboxes)
		for i := range items {
			// Followees' posts overlap from inbox to inbox, as they do.
			start := (i * 7) % (len(all) - size)
			items[i] = inbox.Item{Recipient: domain.UserID(round*inboxes + i + 1), Seq: 1, Op: inbox.OpMaterialise, Posts: all[start : start+size]}
		}
		applied, err := applyChunks(ctx, store, byPartition(items, itemRecipient, 1, setupChunk))
		if err != nil {
			b.Fatal(err)
		}
		if applied != inboxes {
			b.Fatalf("%d of %d inboxes materialised", applied, inboxes)
		}
		after := usedMemory(b, rdb)
		// One inbox is its meta and its segments.
		keys, err := inbox.Keys(ctx, store, domain.UserID(round*inboxes+1))
		if err != nil {
			b.Fatal(err)
		}
		var one int64
		encs := map[string]int{}
		for _, k := range keys {
			enc, err := rdb.ObjectEncoding(ctx, k).Result()
			if err != nil {
				b.Fatal(err)
			}
			n, err := rdb.MemoryUsage(ctx, k).Result()
			if err != nil {
				b.Fatal(err)
			}
			encs[enc]++
			one += n
		}
		enc := fmt.Sprintf("%d keys: %v", len(keys), encs)
		entries := float64(inboxes * size)
		perEntry := float64(after-before) / entries
		perEntryOne := float64(one) / float64(size)
		b.ReportMetric(perEntry, "used-memory-B/entry")
		b.ReportMetric(perEntryOne, "memory-usage-B/entry")
		fmt.Fprintf(os.Stderr, "%d inboxes x %d posts (%s): used_memory +%d B = %.1f B/entry; MEMORY USAGE of one inbox %d B = %.1f B/entry (target <= 24)\n",
			inboxes, size, enc, after-before, perEntry, one, perEntryOne)
	}
}

func usedMemory(b *testing.B, rdb *redis.Client) int64 {
	b.Helper()
	info, err := rdb.InfoMap(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	v, err := strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
	if err != nil {
		b.Fatalf("INFO memory used_memory: %v", err)
	}
	return v
}
