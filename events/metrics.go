package events

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metrics are the event log's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	appends      *prometheus.CounterVec
	appendErrors *prometheus.CounterVec
	appendTime   prometheus.Histogram
	unknownTypes prometheus.Counter
	batchSize    prometheus.Histogram
	resolved     *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		appends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_events_appended_total",
			Help: "Events appended to the log, by type.",
		}, []string{"type"}),
		appendErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_events_append_errors_total",
			Help: "Failed appends, by type.",
		}, []string{"type"}),
		appendTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "feed_events_append_seconds",
			Help:    "Time from append to the log's acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 14),
		}),
		unknownTypes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "feed_events_unknown_types_total",
			Help: "Events skipped by readers because their type is unknown to this build.",
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "feed_events_commit_batch_size",
			Help:    "Events committed together by group commit (one write and sync each).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 10),
		}),
		resolved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_events_append_outcomes_resolved_total",
			Help: "Appends whose outcome was lost (a timeout, a connection or a leader lost) and then looked for in the log, by result: known (stored, or definitely not) or unknown (answered 504).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.appends, m.appendErrors, m.appendTime, m.unknownTypes, m.batchSize, m.resolved)
	return m
}

func (m *Metrics) observeAppend(typ string, start time.Time, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.appendErrors.WithLabelValues(typ).Inc()
		return
	}
	m.appends.WithLabelValues(typ).Inc()
	m.appendTime.Observe(time.Since(start).Seconds())
}

func (m *Metrics) observeResolved(known bool) {
	if m == nil {
		return
	}
	if known {
		m.resolved.WithLabelValues("known").Inc()
	} else {
		m.resolved.WithLabelValues("unknown").Inc()
	}
}

func (m *Metrics) observeBatch(n int) {
	if m != nil && n > 0 {
		m.batchSize.Observe(float64(n))
	}
}

func (m *Metrics) countUnknown() {
	if m != nil {
		m.unknownTypes.Inc()
	}
}

// UnknownTypes returns the count of skipped unknown events, for tests and status.
func (m *Metrics) UnknownTypes() float64 {
	if m == nil {
		return 0
	}
	return counterValue(m.unknownTypes)
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}
