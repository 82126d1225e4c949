package projections

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/feedproject/feed/events"
)

// Metrics are the projectors' Prometheus metrics, labelled by projector. A nil
// *Metrics records nothing.
type Metrics struct {
	positionG   *prometheus.GaugeVec
	lagG        *prometheus.GaugeVec
	eventsC     *prometheus.CounterVec
	batchTime   *prometheus.HistogramVec
	delay       *prometheus.HistogramVec
	fresh       *prometheus.HistogramVec
	failures    *prometheus.CounterVec
	deadLetters *prometheus.CounterVec
	merged      *prometheus.CounterVec
	stages      *prometheus.HistogramVec
	rewinds     *prometheus.CounterVec
	gaps        *prometheus.CounterVec
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
		delay: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "feed_projector_delay_seconds",
			Help: "Time from an event's occurred_at (its command accepted) to its effect being applied by a projector: for the feeds' appliers, per work message, from the oldest event it carries work of.",
			// 1 ms to 64 s, each bucket √2 times the one before: fine enough
			// to tell 250 ms from 350 ms.
			Buckets: prometheus.ExponentialBucketsRange(0.001, 64, 33),
		}, []string{"projector"}),
		fresh: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "feed_inbox_freshness_seconds",
			Help: "Time from an event's occurred_at (its command accepted) to its work written to the inboxes by the feeds' appliers, per work message, from the oldest event it carries work of: for online recipients (holding a live stream, served first) and offline ones.",
			// As the delay's.
			Buckets: prometheus.ExponentialBucketsRange(0.001, 64, 33),
		}, []string{"recipients"}),
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
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "feed_projector_stage_seconds",
			Help:    "Time a batch spent in each stage of a projector that reports them (the feed planner: lock, read, changes, plan, publish, position, wait).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"projector", "stage"}),
		rewinds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_projector_rewinds_total",
			Help: "Times a projector (or a fan-out applier) went back to its checkpoint and read again, by cause: gap (a record that was not the next one expected), event, store, unavailable, verify.",
		}, []string{"projector", "cause"}),
		gaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_projector_known_gap_events_total",
			Help: "Sequences a projector passed over because the stream itself reports them gone (below its first sequence, or deleted); zero while the stream denies deletes and keeps every event.",
		}, []string{"projector"}),
	}
	reg.MustRegister(m.positionG, m.lagG, m.eventsC, m.batchTime, m.delay, m.fresh, m.failures, m.deadLetters, m.merged, m.stages, m.rewinds, m.gaps)
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

// delayed records how long after its occurrence each of recs was applied by
// p, now.
func (m *Metrics) delayed(p string, recs []events.Record) {
	if m == nil {
		return
	}
	o, now := m.delay.WithLabelValues(p), time.Now()
	for _, rec := range recs {
		if !rec.OccurredAt.IsZero() {
			o.Observe(now.Sub(rec.OccurredAt).Seconds())
		}
	}
}

// Delayed records that p applied, now, the effect of an event that occurred
// at: for a projector that applies its effects apart from the log's order of
// batches (the feeds' appliers).
func (m *Metrics) Delayed(p string, at time.Time) {
	if m != nil && !at.IsZero() {
		m.delay.WithLabelValues(p).Observe(time.Since(at).Seconds())
	}
}

// Fresh records that the feeds' appliers wrote, now, to the inboxes of
// online (or offline) recipients the work of an event that occurred at.
func (m *Metrics) Fresh(online bool, at time.Time) {
	if m == nil || at.IsZero() {
		return
	}
	label := "offline"
	if online {
		label = "online"
	}
	m.fresh.WithLabelValues(label).Observe(time.Since(at).Seconds())
}

// Staged records the time, took, a batch of p spent in stage.
func (m *Metrics) Staged(p, stage string, took time.Duration) {
	if m != nil {
		m.stages.WithLabelValues(p, stage).Observe(took.Seconds())
	}
}

func (m *Metrics) failure(p, cause string) {
	if m != nil {
		m.failures.WithLabelValues(p, cause).Inc()
	}
}

// Rewound records that p went back to its checkpoint, and why.
func (m *Metrics) Rewound(p, cause string) {
	if m != nil {
		m.rewinds.WithLabelValues(p, cause).Inc()
	}
}

func (m *Metrics) knownGap(p string, n uint64) {
	if m != nil {
		m.gaps.WithLabelValues(p).Add(float64(n))
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
