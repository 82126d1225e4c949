package loadbench

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/procfs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func parseMetrics(t *testing.T, text string) metricSet {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	require.NoError(t, err)
	return metricSet(fams)
}

const metricsBefore = `# TYPE feed_home_pages_total counter
feed_home_pages_total{source="cache"} 10
feed_home_pages_total{source="postgres"} 5
# TYPE feed_http_request_seconds histogram
feed_http_request_seconds_bucket{method="GET",route="/feed",le="0.001"} 10
feed_http_request_seconds_bucket{method="GET",route="/feed",le="0.01"} 20
feed_http_request_seconds_bucket{method="GET",route="/feed",le="+Inf"} 20
feed_http_request_seconds_sum{method="GET",route="/feed"} 0.05
feed_http_request_seconds_count{method="GET",route="/feed"} 20
feed_http_request_seconds_bucket{method="POST",route="/posts",le="0.001"} 0
feed_http_request_seconds_bucket{method="POST",route="/posts",le="0.01"} 0
feed_http_request_seconds_bucket{method="POST",route="/posts",le="+Inf"} 7
feed_http_request_seconds_sum{method="POST",route="/posts"} 70
feed_http_request_seconds_count{method="POST",route="/posts"} 7
`

const metricsAfter = `# TYPE feed_home_pages_total counter
feed_home_pages_total{source="cache"} 110
feed_home_pages_total{source="postgres"} 5
feed_home_pages_total{source="mixed"} 3
# TYPE feed_http_request_seconds histogram
feed_http_request_seconds_bucket{method="GET",route="/feed",le="0.001"} 60
feed_http_request_seconds_bucket{method="GET",route="/feed",le="0.01"} 118
feed_http_request_seconds_bucket{method="GET",route="/feed",le="+Inf"} 120
feed_http_request_seconds_sum{method="GET",route="/feed"} 0.5
feed_http_request_seconds_count{method="GET",route="/feed"} 120
feed_http_request_seconds_bucket{method="POST",route="/posts",le="0.001"} 0
feed_http_request_seconds_bucket{method="POST",route="/posts",le="0.01"} 0
feed_http_request_seconds_bucket{method="POST",route="/posts",le="+Inf"} 9
feed_http_request_seconds_sum{method="POST",route="/posts"} 90
feed_http_request_seconds_count{method="POST",route="/posts"} 9
`

func TestMetricSums(t *testing.T) {
	m := parseMetrics(t, metricsAfter)
	assert.InDelta(t, 118.0, m.sum(metricPages), 0)
	assert.InDelta(t, 110.0, m.sum(metricPages, "source", "cache"), 0)
	assert.InDelta(t, 0.0, m.sum("no_such_metric"), 0)
	assert.InDelta(t, 120.0, m.sum("feed_http_request_seconds", "route", "/feed"), 0, "a histogram counts its observations")
	b := m.buckets("feed_http_request_seconds", "route", "/feed")
	require.Len(t, b, 3)
	assert.InDelta(t, 60.0, b[0].count, 0)
	assert.InDelta(t, 120.0, b[2].count, 0)
}

func TestServerQuantileBucketIsOfThePhaseOnly(t *testing.T) {
	before, after := parseMetrics(t, metricsBefore), parseMetrics(t, metricsAfter)
	// In the phase: 50 requests ≤ 1 ms, 48 more ≤ 10 ms, 2 slower.
	assert.Equal(t, "≤ 1.00 ms", serverQuantileBucket(before, after, 0.5))
	assert.Equal(t, "≤ 10.0 ms", serverQuantileBucket(before, after, 0.98))
	assert.Equal(t, "> 10.0 ms", serverQuantileBucket(before, after, 0.99))
	assert.Equal(t, "no requests", serverQuantileBucket(after, after, 0.99))
}

func TestQuantileBucketTakesTheSeriesOfItsLabels(t *testing.T) {
	m := parseMetrics(t, `# TYPE feed_projector_delay_seconds histogram
feed_projector_delay_seconds_bucket{projector="readmodel",le="0.1"} 99
feed_projector_delay_seconds_bucket{projector="readmodel",le="1"} 100
feed_projector_delay_seconds_bucket{projector="readmodel",le="+Inf"} 100
feed_projector_delay_seconds_sum{projector="readmodel"} 2
feed_projector_delay_seconds_count{projector="readmodel"} 100
feed_projector_delay_seconds_bucket{projector="feeds-appliers",le="0.1"} 1
feed_projector_delay_seconds_bucket{projector="feeds-appliers",le="1"} 50
feed_projector_delay_seconds_bucket{projector="feeds-appliers",le="+Inf"} 100
feed_projector_delay_seconds_sum{projector="feeds-appliers"} 200
feed_projector_delay_seconds_count{projector="feeds-appliers"} 100
`)
	q := func(q float64, projector string) string {
		return quantileBucket(metricSet{}, m, q, "none", "feed_projector_delay_seconds", "projector", projector)
	}
	assert.Equal(t, "≤ 100.0 ms", q(0.5, "readmodel"))
	assert.Equal(t, "≤ 1.00 s", q(0.5, "feeds-appliers"))
	assert.Equal(t, "> 1.00 s", q(0.99, "feeds-appliers"))
	assert.Equal(t, "none", quantileBucket(m, m, 0.5, "none", "feed_projector_delay_seconds", "projector", "readmodel"))
	assert.Equal(t, "unknown", q(0.5, "no-such-projector"))
}

func TestCPUTimesOf(t *testing.T) {
	// In seconds, as procfs reads them from /proc/stat's ticks.
	c := cpuTimesOf(procfs.CPUStat{User: 1, Nice: 0.05, System: 0.5, Idle: 8, Iowait: 0.4, IRQ: 0.03, SoftIRQ: 0.02, Steal: 0.09, Guest: 0.07})
	assert.Equal(t, 1600*time.Millisecond, c.busy, "user, nice, system, irq and softirq")
	assert.Equal(t, 550*time.Millisecond, c.kernel, "system, irq and softirq")
	assert.Equal(t, 90*time.Millisecond, c.steal, "steal, apart from busy")
	assert.Equal(t, 10090*time.Millisecond, c.total, "guest time is in user already")

	c, err := machineCPU()
	require.NoError(t, err)
	assert.Positive(t, c.busy, "this machine's")
	assert.Greater(t, c.total, c.busy)
}

// TestKdamondCPUSumsTheMonitorsThreads: every kdamond thread's user and
// system time, and no other process's; a machine without one has none.
func TestKdamondCPUSumsTheMonitorsThreads(t *testing.T) {
	root := t.TempDir()
	stat := func(pid, comm string, utime, stime int) {
		require.NoError(t, os.MkdirAll(filepath.Join(root, pid), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, pid, "stat"),
			fmt.Appendf(nil, "%s (%s) S 2 0 0 0 -1 2129984 0 0 0 0 %d %d 0 0 20 0 1 0 100 0 0 %s\n", pid, comm, utime, stime,
				strings.Repeat("0 ", 29)), 0o644)) // every field of a kernel's line
	}
	stat("77", "kdamond.0", 0, 1500)
	stat("78", "kdamond.1", 20, 30)
	stat("500", "redis-server", 9000, 9000)
	fs, err := procfs.NewFS(root)
	require.NoError(t, err)
	d, ok := kdamondCPU(fs)
	require.True(t, ok)
	assert.Equal(t, 15500*time.Millisecond, d, "1 500 + 50 ticks of 10 ms")

	require.NoError(t, os.RemoveAll(filepath.Join(root, "77")))
	require.NoError(t, os.RemoveAll(filepath.Join(root, "78")))
	_, ok = kdamondCPU(fs)
	assert.False(t, ok, "no monitor runs")
}

func TestIsPostmaster(t *testing.T) {
	assert.True(t, isPostmaster([]string{"/usr/lib/postgresql/17/bin/postgres", "-D", "/d", "-p", "5433"}, "5433"))
	assert.False(t, isPostmaster([]string{"/usr/lib/postgresql/17/bin/postgres", "-D", "/d", "-p", "5433"}, "5432"))
	assert.False(t, isPostmaster([]string{"redis-server", "-p", "5433"}, "5433"))
}

func TestPostgresCPUFindsTheLocalServer(t *testing.T) {
	_, err := PostgresCPU(1)(t.Context())
	assert.Error(t, err, "nothing listens on port 1")
}

func TestIsNATSServer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cmdline []string
		want    bool
	}{
		{"feed nats", []string{"/usr/local/bin/feed", "nats", "--dir", "/d/nats", "--port", "4222", "--sync", "always"}, true},
		{"with a host first", []string{"feed", "nats", "--host", "127.0.0.1", "--port", "4222"}, true},
		{"another port", []string{"feed", "nats", "--dir", "/d", "--port", "4223"}, false},
		{"port as the last argument", []string{"feed", "nats", "--dir", "/d", "--port"}, false},
		{"no nats subcommand", []string{"feed", "dev", "--port", "4222"}, false},
		{"nats after the port", []string{"feed", "--port", "4222", "nats"}, false},
		{"the port as nats's own argument", []string{"feed", "--port", "nats", "4222"}, false},
		{"the program named nats", []string{"nats", "--port", "4222"}, false},
		{"--port=N", []string{"feed", "nats", "--port=4222"}, false},
		{"the directory named as the port", []string{"feed", "nats", "--dir", "4222", "--port", "4223"}, false},
		{"one argument holding them all", []string{"sh", "-c", "feed nats --port 4222"}, false},
		{"empty", nil, false},
		{"kernel thread", []string{""}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, isNATSServer(tc.cmdline, "4222"))
		})
	}
}

func TestPerProcessReaders(t *testing.T) {
	pid := os.Getpid()
	// Burn a little CPU so that this process has used some.
	deadline := time.Now().Add(30 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = x * x
	}
	cpu, err := pidCPU(pid)
	require.NoError(t, err)
	assert.Positive(t, cpu)
	rss, err := pidRSS(pid)
	require.NoError(t, err)
	assert.Greater(t, rss, int64(1<<20), "a Go test binary's resident set is over a MiB")
	cmd, err := pidCmdline(pid)
	require.NoError(t, err)
	assert.Equal(t, os.Args, cmd)

	_, err = pidCPU(-1)
	assert.Error(t, err)
	_, err = pidRSS(-1)
	assert.Error(t, err)
}

func TestNATSProcessFindsItsServer(t *testing.T) {
	cpu, memory := NATSProcess(1)
	_, err := cpu(t.Context())
	assert.Error(t, err, "nothing listens on port 1")
	_, err = memory(t.Context())
	assert.Error(t, err)

	// This process stands in for the server: a finder that matches its own
	// command line finds it, and keeps it while its command line matches.
	self := os.Getpid()
	want := os.Args
	f := &procFinder{what: "this test", match: func(cmd []string) bool { return slices.Equal(cmd, want) }}
	pid, err := f.find()
	require.NoError(t, err)
	assert.Equal(t, self, pid)
	pid, err = f.find()
	require.NoError(t, err)
	assert.Equal(t, self, pid, "found again from the remembered id")
	want = []string{"no such process"}
	_, err = f.find()
	assert.Error(t, err)
	assert.Zero(t, f.pid, "forgotten once it no longer matches")
}
