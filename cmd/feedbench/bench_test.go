package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/feedbench/internal/loadbench"
	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
)

// TestBenchReportsEveryFigure runs a short bench against a stack it starts (on
// the harness's servers), profiled, and checks the report has every figure
// the bench promises, measured. The service starts its NATS server as `feed
// dev` does (a child process), whose CPU and memory the bench then reports.
func TestBenchReportsEveryFigure(t *testing.T) {
	t.Run("profiled", func(t *testing.T) {
		out, stderr := benchReport(t, true, "--cpuprofile", "--trace", "300ms")
		assert.Contains(t, stderr, "bench: started the service as process")
		for _, phase := range []string{"mixed", "reads"} {
			// Read from the service's admin route, as gzipped profiles.
			for _, name := range []string{"cpu-" + phase + ".pprof", "heap-" + phase + "-start.pprof", "heap-" + phase + ".pprof"} {
				requireGzipped(t, filepath.Join(out, name))
			}
			b, err := os.ReadFile(filepath.Join(out, "trace-"+phase+".out"))
			if assert.NoError(t, err, "trace of the %s phase", phase) {
				assert.True(t, bytes.HasPrefix(b, []byte("go 1.")), "trace of the %s phase: %.16q", phase, b)
			}
		}
	})
	t.Run("harness's NATS, unprofiled", func(t *testing.T) {
		out, stderr := benchReport(t, false)
		assert.Contains(t, stderr, "bench: started the service as process")
		assert.NoFileExists(t, filepath.Join(out, "cpu-mixed.pprof"))
		assert.NoFileExists(t, filepath.Join(out, "trace-mixed.out"))
	})
}

// requireGzipped fails the test unless path holds something gzipped.
func requireGzipped(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err, "%s is gzipped", path)
	b, err := io.ReadAll(zr)
	require.NoError(t, err, "%s is gzipped", path)
	require.NotEmpty(t, b, path)
}

// benchReport runs the short bench with extra flags, checks its report and
// returns the output directory and what it wrote to stderr. With childNATS
// the service starts its own NATS server instead of using the harness's.
func benchReport(t *testing.T, childNATS bool, flags ...string) (out, stderrText string) {
	extra := map[string]string{"FEED_LOG_LEVEL": "error"}
	if childNATS {
		extra["NATS_URL"] = ""
	}
	env := localstacktest.ForTest(t).Env(extra)
	out = t.TempDir()
	var stdout, stderr localstacktest.SyncBuffer
	err := run(t.Context(), append([]string{"--feed", feedBin(t),
		"--users", "60", "--followers", "6", "--big", "2", "--big-threshold", "30", "--big-post-share", "0.2",
		"--post-rate", "40", "--follow-rate", "10", "--like-rate", "20", "--comment-rate", "10",
		"--read-rate", "40", "--cached-read-rate", "100", "--fresh-rate", "20",
		"--warmup", "300ms", "--duration", "2s", "--read-duration", "700ms", "--raw-duration", "200ms",
		"--setup-concurrency", "64", "--viewers", "20", "--out", out,
	}, flags...), env, &stdout, &stderr)
	require.NoError(t, err, "stderr:\n%s", stderr.String())

	b, err := os.ReadFile(filepath.Join(out, "summary.json"))
	require.NoError(t, err)
	var s loadbench.Summary
	require.NoError(t, json.Unmarshal(b, &s), string(b))

	require.Len(t, s.Commands, 5)
	for _, k := range s.Commands {
		assert.Positive(t, k.Rate, "%s throughput", k.Kind)
		assert.Positive(t, k.P99, "%s p99", k.Kind)
		assert.Zero(t, k.Errors, "%s errors: %v", k.Kind, k.ErrorsExamples)
	}
	assert.Positive(t, s.CommandRate)
	for _, f := range s.Fresh {
		assert.Positive(t, f.Samples, "freshness samples of %s authors", f.Authors)
		assert.Positive(t, f.P50, "freshness p50 of %s authors", f.Authors)
		assert.GreaterOrEqual(t, f.P99, f.P50)
	}
	for _, a := range s.Announce {
		assert.Positive(t, a.Samples, "announcements of %s authors' posts to the viewers' streams", a.Authors)
		assert.GreaterOrEqual(t, a.P99, a.P50)
	}
	for _, f := range s.Inboxes {
		assert.True(t, strings.HasPrefix(f.P99, "≤ "), "the service's inbox freshness for %s recipients: %q", f.Recipients, f.P99)
	}
	for _, f := range s.Feed {
		assert.Positive(t, f.Rate, "feed reads in the %s phase", f.Phase)
		assert.Positive(t, f.P99, "feed p99 in the %s phase", f.Phase)
		// Inboxes this small hold less than a page and a half, so pages may
		// be mixed: the cache, then Postgres to prove the end.
		assert.Positive(t, f.Cache+f.Mixed, "pages from the inboxes in the %s phase", f.Phase)
	}
	assert.Zero(t, s.Feed[1].Postgres, "every inbox is materialised before the read phase")
	assert.Positive(t, s.Raw.ZAdd, "raw ZADD; notes: %v", s.Raw.Notes)
	assert.Positive(t, s.Raw.Publish, "raw publish; notes: %v", s.Raw.Notes)
	assert.Positive(t, s.Raw.Consume, "raw consume; notes: %v", s.Raw.Notes)
	require.Len(t, s.Ratios, 4)
	for _, r := range s.Ratios {
		assert.Positive(t, r.Ratio, "%s against %s", r.Service, r.Limit)
	}
	for _, p := range s.Projectors {
		assert.Positive(t, p.PeakRate, "%s apply rate", p.Name)
	}
	for _, r := range s.Resources {
		if r.Name == "NATS server resident memory" && !childNATS {
			assert.Equal(t, int64(-1), r.End, "the harness's NATS is not the service's child")
			continue
		}
		assert.Positive(t, r.End, "%s", r.Name)
	}
	if childNATS {
		assert.Positive(t, s.CPU[0].NATS, "NATS CPU in the mixed phase")
	}
	assert.Positive(t, s.FanoutRate)
	// A user holds at least their follow sets; an event at least a row.
	assert.Greater(t, s.Scale.RedisPerUser, 50.0, "Redis bytes per materialised user")
	assert.Greater(t, s.Scale.PostgresPerEvent, 20.0, "Postgres bytes per event")
	assert.True(t, s.Fanout.RepairsKnown, "the service's inbox repairs")
	assert.Zero(t, s.Errors)
	var stages []string
	for _, st := range s.Fanout.Stages {
		stages = append(stages, st.Name)
	}
	assert.Equal(t, []string{"lock", "read", "changes", "plan", "publish", "position", "wait"}, stages,
		"the planner's stages, from the service's feed_projector_stage_seconds")

	report, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)
	for _, section := range []string{"## Raw limits", "## Commands", "## Feed freshness", "## `GET /feed`",
		"## Projectors", "Where a planner batch's time went", "## Resources", "## Cost per unit of work", "## The service against the raw limits", "## Targets", "## Live streams"} {
		assert.Contains(t, string(report), section)
	}
	assert.Contains(t, stdout.String(), "## Targets", "the report is printed too")

	f, err := os.Open(filepath.Join(out, "chart.png"))
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err, "chart.png is a PNG")
	assert.Positive(t, img.Bounds().Dx())
	assert.Positive(t, img.Bounds().Dy())
	return out, stderr.String()
}

func TestBenchRefusesOtherMachinesAndBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--url", "http://10.0.0.1:8080"},
		{"--url", "http://example.com:8080"},
		{"--url", "https://127.0.0.1:8080"},
		{"--url", "127.0.0.1:8080"},
		{"--url", "http://127.0.0.1:8080", "--feed", "feed"},
		{"--url", "http://127.0.0.1:8080", "--keep"},
		{"--trace", "-1s"},
		{"--users"},
		{"extra"},
	} {
		err := run(t.Context(), append([]string{"--out", t.TempDir()}, args...), envMap(nil), io.Discard, io.Discard)
		require.ErrorIs(t, err, errUsage, "%v", args)
	}
	for _, ok := range []string{"http://127.0.0.1:8080", "http://localhost:8080/", "http://[::1]:8080", "http://127.1.2.3:9"} {
		assert.NoError(t, checkLoopbackURL(ok), ok)
	}
}

func TestBenchRefusesAnImpossibleGraph(t *testing.T) {
	// Checked before anything is started: no big account fits under 100 users
	// with a threshold of 500.
	err := run(t.Context(), []string{"--users", "100", "--followers", "10", "--out", t.TempDir(), "--url", "http://127.0.0.1:1"},
		envMap(nil), io.Discard, io.Discard)
	require.ErrorIs(t, err, errUsage)
	assert.Contains(t, err.Error(), "big account needs more than 500 followers")
}

// TestBenchFailsWhenItsServiceDies: the service the bench started is killed
// while the bench runs; the bench stops at once and says why.
func TestBenchFailsWhenItsServiceDies(t *testing.T) {
	env := localstacktest.ForTest(t).Env(map[string]string{"FEED_LOG_LEVEL": "error"})
	var stderr localstacktest.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(t.Context(), []string{"--feed", feedBin(t), "--users", "60", "--followers", "6", "--big", "2", "--big-threshold", "30",
			"--duration", "1m", "--out", t.TempDir()}, env, io.Discard, &stderr)
	}()
	started := regexp.MustCompile(`started the service as process (\d+)`)
	var pid int
	require.Eventually(t, func() bool {
		m := started.FindStringSubmatch(stderr.String())
		if m == nil {
			return false
		}
		pid, _ = strconv.Atoi(m[1])
		return strings.Contains(stderr.String(), " graph:") // the bench is under way
	}, time.Minute, 10*time.Millisecond, "stderr:\n%s", stderr.String())
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	select {
	case err := <-done:
		require.Error(t, err)
		assert.Contains(t, err.Error(), "service: feed dev exited: signal: killed")
	case <-time.After(time.Minute):
		t.Fatal("the bench went on without its service")
	}
}

// TestBenchStartsAgainWhenAPortIsTaken: another process holds the HTTP port
// the bench picked for its service, which fails to bind it; the bench starts
// the service again on other ports and runs.
func TestBenchStartsAgainWhenAPortIsTaken(t *testing.T) {
	env := localstacktest.ForTest(t).Env(map[string]string{"FEED_LOG_LEVEL": "error"})
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	var picks atomic.Int32
	wl, opts, err := parseBench([]string{"--feed", feedBin(t), "--users", "60", "--followers", "6", "--big", "2", "--big-threshold", "30",
		"--duration", "1m", "--out", t.TempDir()}, io.Discard)
	require.NoError(t, err)
	opts.ports = func(n int) ([]int, error) {
		ports, err := localstack.FreePorts(n)
		if err == nil && picks.Add(1) == 1 {
			ports[0] = taken.Addr().(*net.TCPAddr).Port
		}
		return ports, err
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stderr localstacktest.SyncBuffer
	done := make(chan error, 1)
	go func() {
		_, err := benchStarted(ctx, wl, opts, env, &stderr)
		done <- err
	}()
	deadline := time.After(time.Minute)
	for !strings.Contains(stderr.String(), " graph:") { // the bench is under way
		select {
		case err := <-done:
			t.Fatalf("the bench ended before it ran: %v; stderr:\n%s", err, stderr.String())
		case <-deadline:
			t.Fatalf("the bench did not start; stderr:\n%s", stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	select {
	case err := <-done:
		t.Logf("the bench, stopped once under way: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the bench did not stop")
	}
	assert.Equal(t, int32(2), picks.Load(), "stderr:\n%s", stderr.String())
	assert.Equal(t, 1, strings.Count(stderr.String(), "starting again on others"), "stderr:\n%s", stderr.String())
	assert.Equal(t, 2, strings.Count(stderr.String(), "started the service as process"), "stderr:\n%s", stderr.String())
}

// TestBenchStartsAgainOnlyForATakenPort: a start is tried again only when it
// failed before the service served, because a port was taken, and at most
// benchStartAttempts times in all.
func TestBenchStartsAgainOnlyForATakenPort(t *testing.T) {
	taken := fmt.Errorf("%w: feed dev exited: exit status 1; last output:\nfeed: listen 127.0.0.1:1: bind: address already in use", errNotServing)
	for _, tc := range []struct {
		name  string
		errs  []error
		tries int
	}{
		{"taken, then started", []error{taken, nil}, 2},
		{"taken every time", []error{taken, taken, taken, taken}, benchStartAttempts},
		{"other start failure", []error{fmt.Errorf("%w: readyz answered 503", errNotServing), nil}, 1},
		{"taken after serving", []error{errors.New("service: address already in use"), nil}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tries := 0
			_, err := startRetrying(io.Discard, func() (*loadbench.Report, error) {
				tries++
				return nil, tc.errs[tries-1]
			})
			assert.Equal(t, tc.tries, tries)
			assert.Equal(t, tc.errs[tries-1], err)
		})
	}
}

// TestBenchGivesItsServiceTheRecordedSettings: the service the bench starts
// runs with the settings the bench's figures were recorded with, unless the
// bench's environment sets them, and with nothing of the bench's own.
func TestBenchGivesItsServiceTheRecordedSettings(t *testing.T) {
	environ := func(getenv func(string) string) map[string]string {
		cfg, env, err := benchStackConfig(t.TempDir(), []int{1, 2, 3, 4}, loadbench.DefaultConfig(), getenv)
		require.NoError(t, err)
		kv := map[string]string{}
		for _, e := range childEnviron(env) {
			k, v, _ := strings.Cut(e, "=")
			kv[k] = v // the last of a name is the one the child sees
		}
		assert.Equal(t, kv["FEED_DEV_REDIS_REALTIME"], strconv.Itoa(cfg.DevRedisRealtime))
		return kv
	}
	kv := environ(envMap(nil))
	assert.Equal(t, "400", kv["GOGC"])
	assert.Equal(t, strconv.Itoa(2*runtime.GOMAXPROCS(0)), kv["GOMAXPROCS"])
	assert.Equal(t, "1", kv["FEED_DEV_REDIS_REALTIME"])
	assert.Equal(t, "127.0.0.1:1", kv["FEED_HTTP_ADDR"])

	kv = environ(envMap(map[string]string{"GOGC": "100", "GOMAXPROCS": "3", "FEED_DEV_REDIS_REALTIME": "0"}))
	assert.Equal(t, "100", kv["GOGC"], "the bench's own setting")
	assert.Equal(t, "3", kv["GOMAXPROCS"])
	assert.Equal(t, "0", kv["FEED_DEV_REDIS_REALTIME"])
}
