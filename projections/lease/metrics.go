package lease

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the leases' Prometheus metrics, labelled by role. A nil
// *Metrics records nothing.
type Metrics struct {
	active     *prometheus.GaugeVec
	partitions *prometheus.GaugeVec
	takeovers  *prometheus.CounterVec
	lostC      *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "feed_role_active",
			Help: "1 while this process is active in a projector role (for appliers: holds a partition), 0 while it stands by.",
		}, []string{"role"}),
		partitions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "feed_role_partitions",
			Help: "Partitions of a shared role (appliers) this process holds.",
		}, []string{"role"}),
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_lease_takeovers_total",
			Help: "Times this process took a role's lease (for appliers, a partition's): at its start, and when the holder stopped, died or moved the partition.",
		}, []string{"role"}),
		lostC: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_lease_lost_total",
			Help: "Times this process lost a lease it held without letting it go: no renewal succeeded within its TTL, or another process had taken it.",
		}, []string{"role"}),
	}
	reg.MustRegister(m.active, m.partitions, m.takeovers, m.lostC)
	return m
}

func (m *Metrics) state(role string, s RoleState) {
	if m == nil {
		return
	}
	v := 0.0
	if s.State == Active {
		v = 1
	}
	m.active.WithLabelValues(role).Set(v)
	if s.Partitions != nil || s.Members > 0 {
		m.partitions.WithLabelValues(role).Set(float64(len(s.Partitions)))
	}
}

func (m *Metrics) tookOver(role string) {
	if m != nil {
		m.takeovers.WithLabelValues(role).Inc()
	}
}

func (m *Metrics) lost(role string) {
	if m != nil {
		m.lostC.WithLabelValues(role).Inc()
	}
}
