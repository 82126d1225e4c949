package loadbench

import (
	"math"
	"runtime/metrics"
	"slices"
	"time"
)

// schedLatencyMetric is how long goroutines waited to run after becoming
// runnable, in this process: when the bench starts the service in its own
// process, a measure of how far the service's goroutines queue for the CPU.
const schedLatencyMetric = "/sched/latencies:seconds"

// schedSnapshot is the scheduling-latency histogram at one instant.
type schedSnapshot struct {
	counts  []uint64
	buckets []float64
}

func readSched() schedSnapshot {
	s := []metrics.Sample{{Name: schedLatencyMetric}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return schedSnapshot{}
	}
	h := s[0].Value.Float64Histogram()
	return schedSnapshot{counts: slices.Clone(h.Counts), buckets: slices.Clone(h.Buckets)}
}

// schedQuantile is the q-quantile of the scheduling latencies between two
// snapshots (the upper bound of its bucket); 0 if none or unknown.
func schedQuantile(before, after schedSnapshot, q float64) time.Duration {
	if len(after.counts) == 0 || len(before.counts) != len(after.counts) {
		return 0
	}
	var total uint64
	for i := range after.counts {
		total += after.counts[i] - before.counts[i]
	}
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for i := range after.counts {
		seen += after.counts[i] - before.counts[i]
		if seen >= rank {
			upper := after.buckets[i+1]
			if math.IsInf(upper, 1) {
				upper = after.buckets[i]
			}
			return time.Duration(upper * float64(time.Second))
		}
	}
	return 0
}
