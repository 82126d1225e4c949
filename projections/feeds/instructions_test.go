package feeds_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
)

// BenchmarkFanoutInstructions counts what BenchmarkFanout times: the
// instructions the Redis server executes per inbox entry while the appliers
// push posts to 500 followers (inboxes of 20, and full ones of 500, so every
// push also trims), next to the same entries as raw pipelined ZADDs into keys
// laid out the same way, and their ratio. The server runs under valgrind's
// callgrind with instrumentation off, switched on (callgrind_control) only
// around each measurement.
//
// Time on this machine moves with everything else running on it, by a third
// between two measurements of the same code; an instruction count moved by
// under 0.5 % between runs, so this tells two versions of the apply script
// apart where the timed benchmark cannot. It leaves out what the kernel does for the network,
// which a raw ZADD spends more of, per entry, than a push: the ratio here is
// lower than the timed one. It is skipped unless valgrind and
// callgrind_control are installed (Debian's valgrind package). The server
// runs many times slower under it; a run takes about half a minute.
//
//	go test -run '^$' -bench BenchmarkFanoutInstructions -benchtime 1x ./projections/feeds
func BenchmarkFanoutInstructions(b *testing.B) {
	for _, tool := range []string{"valgrind", "callgrind_control"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s is not installed (apt-get install -y valgrind)", tool)
		}
	}
	const (
		followersN = 500
		rounds     = 10
	)
	out := b.TempDir()
	r := localstack.RedisUnderForTest(b, "valgrind", "--tool=callgrind", "--instr-atstart=no",
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
	fmt.Fprintf(os.Stderr, "%9s %5s | %14s | %14s | %5s\n", "followers", "inbox", "apply instr/e", "raw instr/e", "ratio")
	for ci, inbox := range []int{20, 500} {
		b.Run(fmt.Sprintf("inbox=%d", inbox), func(b *testing.B) {
			followers := make([]domain.UserID, followersN)
			for i := range followers {
				followers[i] = domain.UserID((ci+1)*1_000_000 + i + 1)
			}
			setupFollowers(b, rdb, store, followers, old[len(old)-inbox:], seq)
			keys := byPartition(followers, self, 1, benchChunk)
			entries := float64(rounds * followersN)
			for b.Loop() {
				raw := count(func() {
					for range rounds {
						if err := rawZAdd(ctx, rdb, keys, posts.next()); err != nil {
							b.Fatal(err)
						}
					}
				}) / entries
				apply := count(func() {
					for range rounds {
						seq++
						p := posts.next()
						items := make([]feeds.Item, len(followers))
						for i, f := range followers {
							items[i] = feeds.Item{Recipient: f, Seq: seq, Op: feeds.OpPush, Posts: []domain.PostID{p}}
						}
						if err := applyAll(ctx, store, [][][][]feeds.Item{byPartition(items, itemRecipient, 1, benchChunk)}, followersN); err != nil {
							b.Fatal(err)
						}
					}
				}) / entries
				b.ReportMetric(apply, "instr/entry")
				b.ReportMetric(raw, "raw-instr/zadd")
				b.ReportMetric(raw/apply, "ratio")
				fmt.Fprintf(os.Stderr, "%9d %5d | %14.0f | %14.0f | %5.2f\n", followersN, inbox, apply, raw, raw/apply)
			}
		})
	}
}

// newCallgrind returns a function that runs fn with the callgrind of process
// pid counting, and returns the instructions it counted; dumps go to dir.
func newCallgrind(b *testing.B, pid int, dir string) func(fn func()) float64 {
	b.Helper()
	control := func(args ...string) {
		b.Helper()
		out, err := exec.Command("callgrind_control", append(args, strconv.Itoa(pid))...).CombinedOutput()
		if err != nil {
			b.Fatalf("callgrind_control %v: %v: %s", args, err, out)
		}
	}
	dumps := 0
	return func(fn func()) float64 {
		b.Helper()
		control("--zero")
		control("--instr=on")
		fn()
		control("--instr=off")
		control("--dump")
		// Each dump is a file of its own, numbered from 1.
		dumps++
		name := filepath.Join(dir, fmt.Sprintf("callgrind.out.%d.%d", pid, dumps))
		data, err := os.ReadFile(name)
		if err != nil {
			b.Fatalf("read callgrind dump: %v", err)
		}
		for line := range strings.Lines(string(data)) {
			if v, ok := strings.CutPrefix(line, "totals:"); ok {
				n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if err != nil {
					b.Fatalf("callgrind dump %s: totals %q: %v", name, v, err)
				}
				return n
			}
		}
		b.Fatalf("callgrind dump %s has no totals", name)
		return 0
	}
}
