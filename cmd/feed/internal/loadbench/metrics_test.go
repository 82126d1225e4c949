package loadbench

import (
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
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

func TestParseCPULine(t *testing.T) {
	busy, kernel, total, err := parseCPULine("cpu  100 5 50 800 40 3 2 0 7 0")
	require.NoError(t, err)
	assert.Equal(t, uint64(160), busy, "user, nice, system, irq, softirq and steal")
	assert.Equal(t, uint64(55), kernel, "system, irq and softirq")
	assert.Equal(t, uint64(1000), total)
	_, _, _, err = parseCPULine("cpu0 1 2 3 4")
	assert.Error(t, err)
	_, _, _, err = parseCPULine("cpu 1 x 3 4")
	assert.Error(t, err)
}

func TestParseStat(t *testing.T) {
	p, err := parseStat("4242 (postgres: feed (x) idle) S 4200 4200 4200 0 -1 4194560 1 0 0 0 17 5 3 2 20 0 1 0 100 1000 10")
	require.NoError(t, err)
	assert.Equal(t, 4242, p.pid)
	assert.Equal(t, 4200, p.ppid)
	assert.Equal(t, []uint64{17, 5, 3, 2}, []uint64{p.utime, p.stime, p.cutime, p.cstime})
	_, err = parseStat("4242 postgres S 1")
	assert.Error(t, err)

	assert.True(t, isPostmaster([]string{"/usr/lib/postgresql/17/bin/postgres", "-D", "/d", "-p", "5433"}, "5433"))
	assert.False(t, isPostmaster([]string{"/usr/lib/postgresql/17/bin/postgres", "-D", "/d", "-p", "5433"}, "5432"))
	assert.False(t, isPostmaster([]string{"redis-server", "-p", "5433"}, "5433"))
}

func TestPostgresCPUFindsTheLocalServer(t *testing.T) {
	_, err := PostgresCPU(1)(t.Context())
	assert.Error(t, err, "nothing listens on port 1")
}
