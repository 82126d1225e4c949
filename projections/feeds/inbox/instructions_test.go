package inbox_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

// BenchmarkFanoutInstructions counts what BenchmarkFanout times: the
// instructions the Redis server executes per inbox entry while the appliers
// push posts to 500 followers (inboxes of 20, and full ones of 500, so every
// push also trims), next to the same entries as raw pipelined ZADDs into keys
// laid out the same way, and their ratio. Two more cases are runs into full
// inboxes, each call giving every follower a run of 8 of a batch's 50 posts
// (large batches) and of 2 of 20 (the planner's batches of some 30 events).
// Beside each count it prints the share of the appliers' instructions that
// ZADD spends looking up the members
// it adds (zzlFind: a listpack is scanned from its head for every member, and
// a new post is in none, so each scans the whole inbox). The server runs
// under valgrind's callgrind with instrumentation off, switched on
// (callgrind_control) only around each measurement.
//
// Time on this machine moves with everything else running on it, by a third
// between two measurements of the same code; an instruction count moved by
// under 0.5 % between runs, so this tells two versions of the apply script
// apart where the timed benchmark cannot. It leaves out what the kernel does
// for the network, which a raw ZADD spends more of, per entry, than a push: the ratio here is
// lower than the timed one. It is skipped unless valgrind, callgrind_control
// and callgrind_annotate are installed (Debian's valgrind package). The
// server runs many times slower under it; a run takes about a minute.
//
//	go test -run '^$' -bench BenchmarkFanoutInstructions -benchtime 1x ./projections/feeds/inbox
func BenchmarkFanoutInstructions(b *testing.B) {
	for _, tool := range []string{"valgrind", "callgrind_control", "callgrind_annotate"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s is not installed (apt-get install -y valgrind)", tool)
		}
	}
	const (
		followersN = 500
		rounds     = 10
	)
	// FEED_BENCH_CALLGRIND_DIR keeps the dumps, one per measurement, for
	// callgrind_annotate.
	out := os.Getenv("FEED_BENCH_CALLGRIND_DIR")
	if out == "" {
		out = b.TempDir()
	}
	r := localstacktest.RedisUnderForTest(b, "valgrind", "--tool=callgrind", "--instr-atstart=no",
		"--callgrind-out-file="+filepath.Join(out, "callgrind.out.%p"))
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), ReadTimeout: -1})
	b.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	if err := rdb.ConfigSet(ctx, "zset-max-listpack-entries", "1024").Err(); err != nil {
		b.Fatal(err)
	}
	count := newCallgrind(b, r.PID(), out)
	store := feeds.NewStore(rdb, feeds.Config{})
	posts := newBenchPosts(b)
	old := posts.take(store.Config().InboxCap)
	seq := uint64(1)
	fmt.Fprintf(os.Stderr, "%-28s | %14s | %14s | %5s | %s\n", "case (500 followers)", "apply instr/e", "raw instr/e", "ratio", "ZADD lookups")
	report := func(b *testing.B, name string, raw, apply measured) {
		b.ReportMetric(apply.perEntry, "instr/entry")
		b.ReportMetric(raw.perEntry, "raw-instr/zadd")
		b.ReportMetric(raw.perEntry/apply.perEntry, "ratio")
		b.ReportMetric(apply.lookups, "lookup-share")
		fmt.Fprintf(os.Stderr, "%-28s | %14.0f | %14.0f | %5.2f | %3.0f %%\n", name, apply.perEntry, raw.perEntry, raw.perEntry/apply.perEntry, 100*apply.lookups)
	}
	for ci, size := range []int{20, 500} {
		b.Run(fmt.Sprintf("inbox=%d", size), func(b *testing.B) {
			followers := benchFollowers(ci, followersN)
			setupFollowers(b, rdb, store, followers, old[len(old)-size:], seq)
			if size == store.Config().InboxCap {
				fillPastCap(b, rdb, store, followers, posts, &seq)
			}
			keys := byPartition(followers, self, 1, benchChunk)
			entries := float64(rounds * followersN)
			for b.Loop() {
				raw := count(entries, func() {
					for range rounds {
						if err := rawZAdd(ctx, rdb, keys, posts.next()); err != nil {
							b.Fatal(err)
						}
					}
				})
				apply := count(entries, func() {
					for range rounds {
						seq++
						p := posts.next()
						items := make([]inbox.Item, len(followers))
						for i, f := range followers {
							items[i] = inbox.Item{Recipient: f, Seq: seq, Op: inbox.OpPush, Posts: []domain.PostID{p}}
						}
						if err := applyAll(ctx, store, [][][][]inbox.Item{byPartition(items, itemRecipient, 1, benchChunk)}, followersN); err != nil {
							b.Fatal(err)
						}
					}
				})
				report(b, fmt.Sprintf("lone pushes, inbox %d", size), raw, apply)
			}
		})
	}
	for ci, c := range []struct{ run, batch int }{{8, 50}, {2, 20}} {
		run, batch := c.run, c.batch
		b.Run(fmt.Sprintf("runs=%d", run), func(b *testing.B) {
			followers := benchFollowers(2+ci, followersN)
			setupFollowers(b, rdb, store, followers, old, seq)
			fillPastCap(b, rdb, store, followers, posts, &seq)
			rng := rand.New(rand.NewPCG(1, 2))
			entries := float64(rounds / 2 * followersN * run)
			// runs is one call's items: each follower gets run of the batch's
			// posts, its own pick, in the log's order.
			runs := func() []inbox.Item {
				fresh := posts.take(batch)
				var items []inbox.Item
				for _, f := range followers {
					picked := rng.Perm(batch)[:run]
					slices.Sort(picked)
					for _, k := range picked {
						items = append(items, inbox.Item{Recipient: f, Seq: seq + uint64(k) + 1, Op: inbox.OpPush, Posts: []domain.PostID{fresh[k]}})
					}
				}
				seq += uint64(batch)
				return items
			}
			for b.Loop() {
				raw := count(entries, func() {
					for range rounds / 2 {
						if err := rawZAddItems(ctx, rdb, runs()); err != nil {
							b.Fatal(err)
						}
					}
				})
				apply := count(entries, func() {
					for range rounds / 2 {
						items := runs()
						if err := applyAll(ctx, store, [][][][]inbox.Item{byPartition(items, itemRecipient, 1, benchChunk)}, int64(len(items))); err != nil {
							b.Fatal(err)
						}
					}
				})
				report(b, fmt.Sprintf("runs of %d of %d, inbox 500", run, batch), raw, apply)
			}
		})
	}
}

// benchFollowers is n followers of a case of its own (ci), distinct from
// every other case's.
func benchFollowers(ci, n int) []domain.UserID {
	followers := make([]domain.UserID, n)
	for i := range followers {
		followers[i] = domain.UserID((ci+1)*1_000_000 + i + 1)
	}
	return followers
}

// rawZAddItems is rawZAdd for items that differ by recipient: one ZADD of each
// item's post into its recipient's raw key, pipelined benchChunk at a time.
func rawZAddItems(ctx context.Context, rdb *redis.Client, items []inbox.Item) error {
	for c := range slices.Chunk(items, benchChunk) {
		pipe := rdb.Pipeline()
		for _, it := range c {
			p := it.Posts[0]
			pipe.ZAdd(ctx, rawKey(it.Recipient), redis.Z{Score: rawScore(p), Member: strconv.FormatInt(int64(p), 10)})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("raw zadd: %w", err)
		}
	}
	return nil
}

// measured is what one callgrind measurement counted: instructions per entry,
// and the share of them under zzlFind.
type measured struct{ perEntry, lookups float64 }

// newCallgrind returns a function that runs fn with the callgrind of process
// pid counting, and returns the instructions it counted per entry (of
// entries) and the share of them under zzlFind; dumps go to dir.
func newCallgrind(b *testing.B, pid int, dir string) func(entries float64, fn func()) measured {
	b.Helper()
	control := func(args ...string) {
		b.Helper()
		out, err := exec.Command("callgrind_control", append(args, strconv.Itoa(pid))...).CombinedOutput()
		if err != nil {
			b.Fatalf("callgrind_control %v: %v: %s", args, err, out)
		}
	}
	dumps := 0
	return func(entries float64, fn func()) measured {
		b.Helper()
		control("--zero")
		control("--instr=on")
		fn()
		control("--instr=off")
		control("--dump")
		// Each dump is a file of its own, numbered from 1.
		dumps++
		name := filepath.Join(dir, fmt.Sprintf("callgrind.out.%d.%d", pid, dumps))
		total, err := callgrindTotal(name)
		if err != nil {
			b.Fatal(err)
		}
		lookups, err := callgrindInclusive(name, "zzlFind")
		if err != nil {
			b.Fatal(err)
		}
		return measured{perEntry: total / entries, lookups: lookups / total}
	}
}

// callgrindTotal is the instructions a callgrind dump counted in all.
func callgrindTotal(name string) (float64, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return 0, fmt.Errorf("read callgrind dump: %w", err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "totals:"); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("callgrind dump %s: totals %q: %w", name, v, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("callgrind dump %s has no totals", name)
}

// callgrindInclusive is the instructions a callgrind dump counted in function
// fn and what it called, as callgrind_annotate reports them (0 if fn never
// ran). Its lines read "1,234,567 (12.34%)  ???:fn [/usr/bin/redis-server]".
func callgrindInclusive(name, fn string) (float64, error) {
	out, err := exec.Command("callgrind_annotate", "--inclusive=yes", "--threshold=100", name).Output()
	if err != nil {
		return 0, fmt.Errorf("callgrind_annotate %s: %w", name, err)
	}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) < 3 || !strings.HasSuffix(fields[2], ":"+fn) {
			continue
		}
		n, err := strconv.ParseFloat(strings.ReplaceAll(fields[0], ",", ""), 64)
		if err != nil {
			return 0, fmt.Errorf("callgrind_annotate %s: %q: %w", name, line, err)
		}
		return n, nil
	}
	return 0, nil
}
