package loadbench

import (
	"math"
	"sync"
	"time"
)

// Histogram buckets: the first holds everything below histMin; each next one
// is histGrowth times as wide as the last, up to histMax. A bucket's middle is
// within (histGrowth-1)/2 of any value in it, so quantiles are within 0.5 %.
const (
	histMin    = time.Microsecond
	histMax    = 1000 * time.Second
	histGrowth = 1.01
)

var (
	histLogGrowth = math.Log(histGrowth)
	histBuckets   = 2 + int(math.Log(float64(histMax)/float64(histMin))/histLogGrowth)
)

// Histogram records durations in fixed memory (a soak must not grow the
// bench's own heap) and answers quantiles to within 0.5 %. It is safe for
// concurrent use.
type Histogram struct {
	mu       sync.Mutex
	counts   []uint64
	n        uint64
	sum      time.Duration
	min, max time.Duration
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram {
	return &Histogram{counts: make([]uint64, histBuckets)}
}

func bucketOf(d time.Duration) int {
	if d < histMin {
		return 0
	}
	i := 1 + int(math.Log(float64(d)/float64(histMin))/histLogGrowth)
	return min(i, histBuckets-1)
}

// bucketMiddle is the geometric middle of bucket i.
func bucketMiddle(i int) time.Duration {
	if i == 0 {
		return histMin / 2
	}
	lo := float64(histMin) * math.Pow(histGrowth, float64(i-1))
	return time.Duration(lo * math.Sqrt(histGrowth))
}

// Record adds one duration.
func (h *Histogram) Record(d time.Duration) {
	d = max(d, 0)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[bucketOf(d)]++
	if h.n == 0 || d < h.min {
		h.min = d
	}
	h.max = max(h.max, d)
	h.n++
	h.sum += d
}

// Count is how many durations were recorded.
func (h *Histogram) Count() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// Max is the longest duration recorded.
func (h *Histogram) Max() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.max
}

// Mean is the average duration; 0 when empty.
func (h *Histogram) Mean() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}

// Quantile is the q-quantile (0 < q ≤ 1) by the nearest-rank method: the
// smallest recorded value with at least q of all values at or below it, to
// within 0.5 % (exact for the minimum and the maximum), and never outside them.
// It is 0 when the histogram is empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	switch rank {
	case 1:
		return h.min
	case h.n:
		return h.max
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(max(bucketMiddle(i), h.min), h.max)
		}
	}
	return h.max
}

// Percentile is the q-quantile of durations already sorted ascending, by the
// nearest-rank method (the exact counterpart of Histogram.Quantile); 0 when
// there are none.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// merge adds o's durations to h.
func (h *Histogram) merge(o *Histogram) {
	o.mu.Lock()
	counts := append([]uint64(nil), o.counts...)
	n, sum, lo, hi := o.n, o.sum, o.min, o.max
	o.mu.Unlock()
	if n == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, c := range counts {
		h.counts[i] += c
	}
	if h.n == 0 || lo < h.min {
		h.min = lo
	}
	h.max = max(h.max, hi)
	h.n += n
	h.sum += sum
}
