package loadbench

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestPercentileNearestRank(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		out := make([]time.Duration, len(vs))
		for i, v := range vs {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	cases := []struct {
		sorted []time.Duration
		q      float64
		want   time.Duration
	}{
		{nil, 0.5, 0},
		{ms(7), 0.5, 7 * time.Millisecond},
		{ms(7), 0.99, 7 * time.Millisecond},
		{ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{ms(1, 2, 3, 4), 0.51, 3 * time.Millisecond},
		{ms(1, 2, 3, 4), 1, 4 * time.Millisecond},
		{ms(1, 2, 3, 4), 0, time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 0.9, 9 * time.Millisecond},
		{ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 0.99, 10 * time.Millisecond},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, Percentile(c.sorted, c.q), "%v q=%v", c.sorted, c.q)
	}
}

func TestHistogramQuantilesAreWithinHalfAPercent(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	h := NewHistogram()
	var exact []time.Duration
	for range 20_000 {
		// Log-normal-ish latencies from 50 µs to seconds.
		d := time.Duration(float64(time.Millisecond) * rng.ExpFloat64() * rng.ExpFloat64() * 3)
		d += 50 * time.Microsecond
		h.Record(d)
		exact = append(exact, d)
	}
	slices.Sort(exact)
	for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 0.999, 1} {
		want := Percentile(exact, q)
		got := h.Quantile(q)
		assert.InEpsilon(t, float64(want), float64(got), 0.005, "q=%v: want %v, got %v", q, want, got)
	}
	assert.Equal(t, uint64(len(exact)), h.Count())
	assert.Equal(t, exact[len(exact)-1], h.Max())
	assert.Equal(t, exact[len(exact)-1], h.Quantile(1), "never beyond the maximum")
}

func TestHistogramEdges(t *testing.T) {
	h := NewHistogram()
	assert.Equal(t, time.Duration(0), h.Quantile(0.5), "empty")
	assert.Equal(t, time.Duration(0), h.Mean())
	h.Record(-time.Second) // a clock step back counts as zero
	h.Record(300 * time.Nanosecond)
	h.Record(2000 * time.Second) // beyond the last bucket
	assert.Equal(t, time.Duration(0), h.Quantile(0.01))
	assert.Equal(t, 2000*time.Second, h.Quantile(1))
	assert.Equal(t, uint64(3), h.Count())

	one := NewHistogram()
	one.Record(42 * time.Millisecond)
	assert.Equal(t, 42*time.Millisecond, one.Quantile(0.5), "a single value is exact: clamped to min and max")
}

func TestHistogramConcurrentRecords(t *testing.T) {
	h := NewHistogram()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 1000 {
				h.Record(time.Duration(i) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, uint64(8000), h.Count())
}

func TestSchedQuantile(t *testing.T) {
	before := schedSnapshot{counts: []uint64{5, 0, 0, 0}, buckets: []float64{0, 0.001, 0.01, 0.1, math.Inf(1)}}
	after := schedSnapshot{counts: []uint64{55, 40, 9, 1}, buckets: before.buckets}
	// Between them: 50 at most 1 ms, 40 at most 10 ms, 9 at most 100 ms, 1 above.
	assert.Equal(t, time.Millisecond, schedQuantile(before, after, 0.5))
	assert.Equal(t, 10*time.Millisecond, schedQuantile(before, after, 0.9))
	assert.Equal(t, 100*time.Millisecond, schedQuantile(before, after, 0.99))
	assert.Equal(t, 100*time.Millisecond, schedQuantile(before, after, 1), "the open last bucket reports its lower bound")
	assert.Equal(t, time.Duration(0), schedQuantile(after, after, 0.5), "nothing in between")
	assert.Equal(t, time.Duration(0), schedQuantile(schedSnapshot{}, schedSnapshot{}, 0.5))
	assert.NotEmpty(t, readSched().counts, "the runtime has the metric")
}
