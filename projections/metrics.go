package projections

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the projectors' Prometheus metrics, labelled by projector. A nil
// *Metrics records nothing.
type Metrics struct {
	positionG   *prometheus.GaugeVec
	lagG        *prometheus.GaugeVec
	eventsC     *prometheus.CounterVec
	batchTime   *prometheus.HistogramVec
	failures    *prometheus.CounterVec
	deadLetters *prometheus.CounterVec
	merged      *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		positionG: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "feed_projector_position",
			Help: "Sequence of the last event a projector applied (its checkpoint).",
		}, []string{"projector"}),
		lagG: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "feed_projector_lag_events",
			Help: "Events in the log a projector has not applied yet (stream head minus checkpoint).",
		}, []string{"projector"}),
		eventsC: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_projector_events_total",
			Help: "Events applied by a projector.",
		}, []string{"projector"}),
		batchTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "feed_projector_batch_seconds",
			Help:    "Time to apply one batch, commit included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"projector"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_projector_failures_total",
			Help: "Failed batches (each rewinds to the checkpoint), by cause: event or store.",
		}, []string{"projector", "cause"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_projector_dead_letters_total",
			Help: "Events a projector gave up on after repeated failures (see FEED_DEADLETTER).",
		}, []string{"projector"}),
		merged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_projector_follow_events_merged_total",
			Help: "Follow/unfollow events not applied: collapsed into a later event of the same pair in a batch, or dropped as no change.",
		}, []string{"projector", "how"}),
	}
	reg.MustRegister(m.positionG, m.lagG, m.eventsC, m.batchTime, m.failures, m.deadLetters, m.merged)
	return m
}

func (m *Metrics) position(p string, seq uint64) {
	if m != nil {
		m.positionG.WithLabelValues(p).Set(float64(seq))
	}
}

func (m *Metrics) lag(p string, n uint64) {
	if m != nil {
		m.lagG.WithLabelValues(p).Set(float64(n))
	}
}

func (m *Metrics) applied(p string, n int, seq uint64, took time.Duration) {
	if m != nil {
		m.eventsC.WithLabelValues(p).Add(float64(n))
		m.positionG.WithLabelValues(p).Set(float64(seq))
		m.batchTime.WithLabelValues(p).Observe(took.Seconds())
	}
}

func (m *Metrics) failure(p, cause string) {
	if m != nil {
		m.failures.WithLabelValues(p, cause).Inc()
	}
}

func (m *Metrics) deadLettered(p string) {
	if m != nil {
		m.deadLetters.WithLabelValues(p).Inc()
	}
}

// CountMerged records follow events a projector did not apply: collapsed into a
// later event of the same pair, or dropped because they changed nothing.
func (m *Metrics) CountMerged(p string, collapsed, noop int) {
	if m != nil {
		m.merged.WithLabelValues(p, "collapsed").Add(float64(collapsed))
		m.merged.WithLabelValues(p, "noop").Add(float64(noop))
	}
}
