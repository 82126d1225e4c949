package loadbench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// Report is what one run measured.
type Report struct {
	Config Config
	// Stack describes the service; CommandLine is how the bench was run.
	Stack, CommandLine string
	// MachineNotes are facts of the machine that weigh on latency (DAMON's
	// monitors), read as the run starts.
	MachineNotes      []string
	Started, Finished time.Time
	Raw               RawLimits
	Setup             SetupReport
	// The phases: the warm-up (only its errors are reported), the measured
	// mixed phase and the read phase.
	Warmup, Mixed, Reads *phase
	// Drain is how long after the mixed phase the projectors took to apply
	// everything up to DrainPosition; DrainError says why they did not.
	Drain         time.Duration
	DrainPosition uint64
	DrainError    string
	// Streams is what the viewers' streams read (none without viewers).
	Streams StreamsReport
	// The stores' sizes before the graph is built, once every inbox is
	// materialised (the mixed phase's start), and once the mixed phase is
	// drained.
	BeforeGraph, Materialised, Drained Mark
	Samples                            []Sample
}

// Mark is the stores' sizes and the log's position at one point of a run.
type Mark struct {
	// Position is the highest log position a command was answered with.
	Position uint64
	// RedisData is Redis' used_memory without its clients' buffers and
	// PostgresSize the database's size, in bytes; -1 unknown.
	RedisData, PostgresSize int64
}

// ScaleSummary is what a unit of work costs, the figures that should stay the
// same as the graph grows: per user materialised, Redis' memory (the graph's
// follow sets and a warm inbox, before any post: what a user costs to hold);
// per event of the warm-up and the mixed phase, the growth of the read
// model's database once the projectors applied it. -1 unknown.
type ScaleSummary struct {
	RedisPerUser, PostgresPerEvent float64
}

// StreamsReport is the viewers' streams over the warm-up and the mixed phase.
type StreamsReport struct {
	Viewers int
	// Events is the post events read; Reconnects the streams that ended and
	// were opened again where they left off.
	Events, Reconnects int64
}

// SetupReport is the graph's creation and the inboxes' materialisation.
type SetupReport struct {
	Follows, FollowErrors       int
	FollowTime, MaterialiseTime time.Duration
	MaterialisePasses           int
}

// Summary is the report's figures, as the Markdown report shows them.
type Summary struct {
	Commands []KindSummary
	// CommandRate is all commands answered 202 per second in the mixed phase.
	CommandRate float64
	// Fresh is the freshness of ordinary authors' posts, then big authors'.
	Fresh [2]FreshSummary
	// Announce is the time from a post's 202 to its event on a viewer's
	// stream, ordinary authors' then big authors' (no samples without
	// viewers).
	Announce [2]FreshSummary
	// Inboxes is the buckets of the service's feed_inbox_freshness_seconds
	// holding its p50 and p99 over the mixed phase, for online recipients
	// then offline ones.
	Inboxes [2]InboxFreshness
	// Feed is GET /feed in the mixed phase, then in the read phase.
	Feed [2]FeedSummary
	Raw  RawLimits
	// FanoutRate is the inbox writes per second the mixed phase's posts asked
	// for.
	FanoutRate float64
	Fanout     FanoutSummary
	Scale      ScaleSummary
	Projectors []ProjectorSummary
	Resources  []ResourceSummary
	// CPU is where the machine's CPU went in the mixed and the read phase.
	CPU []CPUSummary
	// Disturbed is the mixed phase's time with other work on the machine.
	Disturbed Disturbance
	Ratios    []Ratio
	Targets   []TargetCheck
	// Errors are the failed and dropped requests of the warm-up, mixed and
	// read phases.
	Errors, Dropped int64
}

// KindSummary is one request kind in the mixed phase.
type KindSummary struct {
	Kind           string
	Target, Rate   float64 // per second
	OK, Errors     int64
	P50, P99, Max  time.Duration
	ErrorsExamples []string `json:",omitempty"`
}

// FreshSummary is the time from a post's 202 to its presence in followers'
// feeds.
type FreshSummary struct {
	Authors       string
	Samples       int
	Missed        int // polls that gave up after FreshTimeout
	P50, P99, Max time.Duration
}

// InboxFreshness is the service's time from an event to its work written to
// the inboxes of online (holding a live stream) or offline recipients.
type InboxFreshness struct {
	Recipients string
	P50, P99   string
}

// PollRate is the freshness poller's reads a second in the mixed phase (of
// both kinds of author).
func (r *Report) PollRate() float64 {
	if r.Mixed == nil || r.Config.Duration <= 0 {
		return 0
	}
	st := r.Mixed.kinds[kindPoll]
	return float64(st.ok.Load()+st.errs.Load()) / r.Config.Duration.Seconds()
}

// FeedSummary is GET /feed in one phase: the bench's view (every page it read,
// next pages included) and the service's (pages by source).
type FeedSummary struct {
	Phase                  string
	Target, Rate           float64
	OK, Errors             int64
	P50, P99, Max          time.Duration
	Cache, Mixed, Postgres float64
	HitRatio               float64
	ServerP99Bucket        string
	// LateP50 and LateP99: how late after their intended times the
	// generator started the phase's requests (every kind), a delay of its
	// own that every latency above includes.
	LateP50, LateP99 time.Duration
	// Slow is how the reads slower than 10 ms fell in time.
	Slow SlowReads
}

// ProjectorSummary is one projector over the mixed phase and the whole run.
type ProjectorSummary struct {
	Name               string
	MeanRate, PeakRate float64 // events applied per second
	LagMax, LagEnd     float64 // events, in the mixed phase and at its end
	// From the service's metrics over the mixed phase (the feeds: its
	// planner): batches applied, their mean duration and size.
	Batches        float64
	MeanBatch      time.Duration
	EventsPerBatch float64
	// DelayP50 and DelayP99 are the buckets of the service's
	// feed_projector_delay_seconds (the feeds: its appliers') that hold those
	// quantiles over the mixed phase, e.g. "≤ 256.0 ms".
	DelayP50, DelayP99 string
}

// FanoutSummary is the feed projector's inside during the mixed phase: how
// far its planner is behind the log and the work messages it sends its
// appliers.
type FanoutSummary struct {
	Known                        bool
	PlannerLagMax, PlannerLagEnd float64
	MessagesPerSec               float64 // published
	BacklogMax, BacklogEnd       float64 // messages not yet applied
	// Stages is where the planner's batches spent their time (the service's
	// feed_projector_stage_seconds over the mixed phase), in order.
	Stages []StageSummary
	// Appliers is where the appliers' messages spent their time.
	Appliers ApplierSummary
	// Repairs is how many inbox entries the service's maintenance round
	// repaired in the phase (feed_inbox_repairs_total: ghosts, missing
	// posts, over-long inboxes; zero in a correct system); RepairsKnown is
	// false when the service exports none.
	Repairs      float64
	RepairsKnown bool
}

// ApplierSummary is the appliers' feed_projector_stage_seconds over the mixed
// phase: per message, the wait for it (Fetch, idle time included) and its
// application (Apply), made of RoundsPerMessage round trips to Redis of Round
// each. Known is false when the service recorded none.
type ApplierSummary struct {
	Known            bool
	Fetch, Apply     time.Duration
	Round            time.Duration
	RoundsPerMessage float64
}

// StageSummary is the mean time a batch spent in one stage of the planner.
type StageSummary struct {
	Name string
	Mean time.Duration
}

// plannerStages are the feed planner's stages in a batch's order (see
// fanout.Planner.Apply).
var plannerStages = []string{"lock", "read", "changes", "plan", "publish", "position", "wait"}

// ResourceSummary is one resource at the mixed phase's start and end.
type ResourceSummary struct {
	Name         string
	Start, End   int64 // bytes; -1 unknown
	GrowthPerMin float64
}

// Ratio is the service against a raw limit.
type Ratio struct {
	Service, Limit string
	ServiceRate    float64
	LimitRate      float64
	Ratio          float64
}

// TargetCheck is one of the targets.
type TargetCheck struct {
	Target, Measured string
	Met              bool
}

// Summary computes the report's figures.
func (r *Report) Summary() Summary {
	s := Summary{Raw: r.Raw}
	secs := r.Config.Duration.Seconds()
	s.Commands = r.commandSummaries()
	for _, k := range s.Commands {
		s.CommandRate += k.Rate
	}
	for i, big := range []bool{false, true} {
		sorted, missed := r.Mixed.fresh.sorted(big)
		f := FreshSummary{Authors: "ordinary", Samples: len(sorted), Missed: missed,
			P50: Percentile(sorted, 0.5), P99: Percentile(sorted, 0.99)}
		if big {
			f.Authors = "big (merged at read time)"
		}
		if len(sorted) > 0 {
			f.Max = sorted[len(sorted)-1]
		}
		s.Fresh[i] = f
	}
	for i, big := range []bool{false, true} {
		sorted, _ := r.Mixed.announce.sorted(big)
		a := FreshSummary{Authors: s.Fresh[i].Authors, Samples: len(sorted), P50: Percentile(sorted, 0.5), P99: Percentile(sorted, 0.99)}
		if len(sorted) > 0 {
			a.Max = sorted[len(sorted)-1]
		}
		s.Announce[i] = a
	}
	for i, rec := range []string{"online", "offline"} {
		q := func(q float64) string {
			return quantileBucket(r.Mixed.before, r.Mixed.after, q, "none", "feed_inbox_freshness_seconds", "recipients", rec)
		}
		s.Inboxes[i] = InboxFreshness{Recipients: rec, P50: q(0.5), P99: q(0.99)}
	}
	s.Feed[0] = feedSummary(r.Mixed, r.Config.ReadRate, r.Config.Duration, kindFeed, kindFeedNext)
	s.Feed[1] = feedSummary(r.Reads, r.Config.CachedReadRate, r.Config.ReadDuration, kindFeed)
	s.FanoutRate = float64(r.Mixed.fanout.Load()) / secs
	s.Projectors = r.projectorSummaries()
	s.Fanout = r.fanoutSummary()
	s.Scale = r.scaleSummary()
	s.Resources = r.resourceSummaries()
	s.CPU = []CPUSummary{r.cpuSummary(r.Mixed), r.cpuSummary(r.Reads)}
	s.Disturbed = disturbance(r.mixedSamples())
	for _, p := range []*phase{r.Warmup, r.Mixed, r.Reads} {
		s.Errors += p.errors()
		s.Dropped += p.dropped.Load()
	}
	s.Ratios = r.ratios(s)
	s.Targets = r.targets(s)
	return s
}

func (r *Report) commandSummaries() []KindSummary {
	targets := map[kind]float64{
		kindPost: r.Config.PostRate, kindFollow: r.Config.FollowRate / 2, kindUnfollow: r.Config.FollowRate / 2,
		kindLike: r.Config.LikeRate, kindComment: r.Config.CommentRate,
	}
	var out []KindSummary
	for k := kindPost; k <= kindComment; k++ {
		st := r.Mixed.kinds[k]
		ks := KindSummary{
			Kind: k.String(), Target: targets[k], Rate: float64(st.ok.Load()) / r.Config.Duration.Seconds(),
			OK: st.ok.Load(), Errors: st.errs.Load(),
			P50: st.latency.Quantile(0.5), P99: st.latency.Quantile(0.99), Max: st.latency.Max(),
		}
		ks.ErrorsExamples = examples(st)
		out = append(out, ks)
	}
	return out
}

func examples(st *kindStats) []string {
	st.mu.Lock()
	defer st.mu.Unlock()
	var out []string
	for _, msg := range slices.Sorted(maps.Keys(st.examples)) {
		out = append(out, fmt.Sprintf("%d× %s", st.examples[msg], msg))
	}
	return out
}

func feedSummary(p *phase, target float64, d time.Duration, kinds ...kind) FeedSummary {
	merged := NewHistogram()
	fs := FeedSummary{Phase: p.name, Target: target}
	for _, k := range kinds {
		st := p.kinds[k]
		fs.OK += st.ok.Load()
		fs.Errors += st.errs.Load()
		merged.merge(st.latency)
	}
	fs.Rate = float64(fs.OK) / d.Seconds()
	fs.P50, fs.P99, fs.Max = merged.Quantile(0.5), merged.Quantile(0.99), merged.Max()
	fs.LateP50, fs.LateP99 = p.late.Quantile(0.5), p.late.Quantile(0.99)
	fs.Slow = p.slowReadSummary()
	if p.before != nil && p.after != nil {
		delta := func(source string) float64 {
			return p.after.sum(metricPages, "source", source) - p.before.sum(metricPages, "source", source)
		}
		fs.Cache, fs.Mixed, fs.Postgres = delta("cache"), delta("mixed"), delta("postgres")
		if total := fs.Cache + fs.Mixed + fs.Postgres; total > 0 {
			fs.HitRatio = fs.Cache / total
		}
		fs.ServerP99Bucket = serverQuantileBucket(p.before, p.after, 0.99)
	}
	return fs
}

// serverQuantileBucket is the upper bound of the service's own latency
// histogram bucket (feed_http_request_seconds for GET /feed) that holds the q
// quantile of the phase's requests.
func serverQuantileBucket(before, after metricSet, q float64) string {
	return quantileBucket(before, after, q, "no requests", "feed_http_request_seconds", "route", "/feed")
}

// quantileBucket is the upper bound of the bucket of the service's histogram
// family (its series with the labels given) that holds the q quantile of what
// it observed between before and after; none if it observed nothing.
func quantileBucket(before, after metricSet, q float64, none, family string, labels ...string) string {
	b, a := before.buckets(family, labels...), after.buckets(family, labels...)
	if len(a) == 0 || len(a) != len(b) && len(b) != 0 {
		return "unknown"
	}
	delta := func(i int) float64 {
		if len(b) == 0 {
			return a[i].count
		}
		return a[i].count - b[i].count
	}
	total := delta(len(a) - 1)
	if total <= 0 {
		return none
	}
	for i := range a {
		if delta(i) >= q*total {
			if math.IsInf(a[i].upper, 1) {
				return "> " + fmtDuration(time.Duration(a[i-1].upper*float64(time.Second)))
			}
			return "≤ " + fmtDuration(time.Duration(a[i].upper*float64(time.Second)))
		}
	}
	return "unknown"
}

func (r *Report) mixedSamples() []Sample {
	var out []Sample
	for _, s := range r.Samples {
		if s.Stage == "mixed" {
			out = append(out, s)
		}
	}
	return out
}

func (r *Report) projectorSummaries() []ProjectorSummary {
	mixed := r.mixedSamples()
	out := []ProjectorSummary{
		{Name: "readmodel", DelayP50: "unknown", DelayP99: "unknown"},
		{Name: "feeds (planner and appliers)", DelayP50: "unknown", DelayP99: "unknown"},
	}
	for _, s := range r.Samples {
		out[0].PeakRate = max(out[0].PeakRate, s.ReadModelRate)
		out[1].PeakRate = max(out[1].PeakRate, s.FeedsRate)
	}
	for _, s := range mixed {
		out[0].MeanRate += s.ReadModelRate / float64(len(mixed))
		out[1].MeanRate += s.FeedsRate / float64(len(mixed))
		out[0].LagMax = max(out[0].LagMax, s.ReadModelLag)
		out[1].LagMax = max(out[1].LagMax, s.FeedsLag)
	}
	if n := len(mixed); n > 0 {
		out[0].LagEnd, out[1].LagEnd = mixed[n-1].ReadModelLag, mixed[n-1].FeedsLag
	}
	if r.Mixed.before != nil && r.Mixed.after != nil {
		// The feeds' delay is their appliers': a post is in the inboxes then.
		for i, name := range []string{"readmodel", "feeds-appliers"} {
			before, after := r.Mixed.before, r.Mixed.after
			out[i].DelayP50 = quantileBucket(before, after, 0.5, "none", "feed_projector_delay_seconds", "projector", name)
			out[i].DelayP99 = quantileBucket(before, after, 0.99, "none", "feed_projector_delay_seconds", "projector", name)
		}
		for i, name := range []string{"readmodel", "feeds"} {
			before, after := r.Mixed.before, r.Mixed.after
			batches := after.sum("feed_projector_batch_seconds", "projector", name) - before.sum("feed_projector_batch_seconds", "projector", name)
			if batches <= 0 {
				continue
			}
			secs := after.histSum("feed_projector_batch_seconds", "projector", name) - before.histSum("feed_projector_batch_seconds", "projector", name)
			evs := after.sum("feed_projector_events_total", "projector", name) - before.sum("feed_projector_events_total", "projector", name)
			out[i].Batches = batches
			out[i].MeanBatch = time.Duration(secs / batches * float64(time.Second))
			out[i].EventsPerBatch = evs / batches
		}
	}
	return out
}

// CPUSummary is the mean cores used in one phase (-1 unknown), the mean
// number of the service's goroutines, and how long this process's goroutines
// waited to run once runnable (the service's when it ran in the bench's
// process).
type CPUSummary struct {
	Phase                                   string
	Machine, Process, Redis, Postgres, NATS float64
	// Bench is the bench's own process (-1 when the service ran inside it).
	Bench float64
	// Kernel is the part of Machine spent in the kernel.
	Kernel float64
	// Steal is the machine's CPU time the hypervisor gave to something else
	// (not in Machine); DAMON the kernel's DAMON monitors' (in Machine; -1
	// when none runs).
	Steal, DAMON       float64
	Goroutines         float64
	SchedP50, SchedP99 time.Duration
	// ServiceSchedP99 is the bucket of the service's
	// go_sched_latencies_seconds that holds the p99 of its goroutines' waits
	// for a CPU over the phase, e.g. "≤ 917.5 µs".
	ServiceSchedP99 string
}

// Disturbance is how long work other than the service, its servers and the
// bench took a share of the machine worth noting (disturbedCores or more,
// over disturbedWindow), out of the seconds of the phase where that is known.
type Disturbance struct {
	Seconds, Known int
	// Peak is the most cores that other work took, over the window.
	Peak float64
}

const (
	disturbedCores  = 0.3
	disturbedWindow = 5 // samples, one a second
)

// disturbance finds the samples whose other work (Sample.OtherCPU), averaged
// with the samples before them over the window, reached disturbedCores. A
// soak's tail latencies come from its worst minutes: on a shared machine
// those can be minutes when something else took a core.
func disturbance(samples []Sample) Disturbance {
	var d Disturbance
	var window []float64
	for _, s := range samples {
		v := s.OtherCPU()
		if v < 0 {
			window = window[:0]
			continue
		}
		d.Known++
		window = append(window, v)
		if len(window) > disturbedWindow {
			window = window[1:]
		}
		mean := 0.0
		for _, w := range window {
			mean += w
		}
		mean /= float64(len(window))
		d.Peak = max(d.Peak, mean)
		if mean >= disturbedCores {
			d.Seconds++
		}
	}
	return d
}

func (r *Report) cpuSummary(p *phase) CPUSummary {
	stage := p.name
	mean := func(f func(Sample) float64) float64 {
		sum, n := 0.0, 0
		for _, s := range r.Samples {
			if v := f(s); s.Stage == stage && v >= 0 {
				sum += v
				n++
			}
		}
		if n == 0 {
			return -1
		}
		return sum / float64(n)
	}
	return CPUSummary{
		Phase:           stage,
		Machine:         mean(func(s Sample) float64 { return s.MachineCPU }),
		Kernel:          mean(func(s Sample) float64 { return s.KernelCPU }),
		Steal:           mean(func(s Sample) float64 { return s.StealCPU }),
		DAMON:           mean(func(s Sample) float64 { return s.DAMONCPU }),
		Process:         mean(func(s Sample) float64 { return s.ProcessCPU }),
		Redis:           mean(func(s Sample) float64 { return s.RedisCPU }),
		Postgres:        mean(func(s Sample) float64 { return s.PostgresCPU }),
		NATS:            mean(func(s Sample) float64 { return s.NATSCPU }),
		Bench:           mean(func(s Sample) float64 { return s.BenchCPU }),
		Goroutines:      mean(func(s Sample) float64 { return float64(s.Goroutines) }),
		SchedP50:        schedQuantile(p.schedBefore, p.schedAfter, 0.5),
		SchedP99:        schedQuantile(p.schedBefore, p.schedAfter, 0.99),
		ServiceSchedP99: quantileBucket(p.before, p.after, 0.99, "none", "go_sched_latencies_seconds"),
	}
}

func (r *Report) fanoutSummary() FanoutSummary {
	mixed := r.mixedSamples()
	var f FanoutSummary
	for _, s := range mixed {
		if !s.KnownFanout {
			continue
		}
		f.Known = true
		f.PlannerLagMax = max(f.PlannerLagMax, s.PlannerLag)
		f.BacklogMax = max(f.BacklogMax, s.FanoutBacklog)
		f.MessagesPerSec += s.FanoutRate / float64(len(mixed))
		f.PlannerLagEnd, f.BacklogEnd = s.PlannerLag, s.FanoutBacklog
	}
	if before, after := r.Mixed.before, r.Mixed.after; before != nil && after != nil {
		// The phase's count and mean of one stage of feed_projector_stage_seconds.
		stage := func(projector, st string) (n float64, mean time.Duration) {
			const family = "feed_projector_stage_seconds"
			labels := []string{"projector", projector, "stage", st}
			n = after.sum(family, labels...) - before.sum(family, labels...)
			if n <= 0 {
				return 0, 0
			}
			secs := after.histSum(family, labels...) - before.histSum(family, labels...)
			return n, time.Duration(secs / n * float64(time.Second))
		}
		for _, st := range plannerStages {
			if n, mean := stage("feeds", st); n > 0 {
				f.Stages = append(f.Stages, StageSummary{Name: st, Mean: mean})
			}
		}
		_, fetch := stage("feeds-appliers", "fetch")
		msgs, apply := stage("feeds-appliers", "apply")
		rounds, round := stage("feeds-appliers", "round")
		if msgs > 0 {
			f.Appliers = ApplierSummary{Known: true, Fetch: fetch, Apply: apply, Round: round, RoundsPerMessage: rounds / msgs}
		}
		const repairs = "feed_inbox_repairs_total"
		if _, ok := after[repairs]; ok {
			f.Repairs, f.RepairsKnown = after.sum(repairs)-before.sum(repairs), true
		}
	}
	return f
}

func (r *Report) scaleSummary() ScaleSummary {
	sc := ScaleSummary{RedisPerUser: -1, PostgresPerEvent: -1}
	if b, m := r.BeforeGraph.RedisData, r.Materialised.RedisData; b >= 0 && m >= 0 && r.Config.Users > 0 {
		sc.RedisPerUser = float64(m-b) / float64(r.Config.Users)
	}
	// Unless the projectors applied every event, the database is not yet the
	// size of them.
	m, d := r.Materialised, r.Drained
	if r.DrainError == "" && m.PostgresSize >= 0 && d.PostgresSize >= 0 && d.Position > m.Position {
		sc.PostgresPerEvent = float64(d.PostgresSize-m.PostgresSize) / float64(d.Position-m.Position)
	}
	return sc
}

// The rows of the resources that the memory target reads: the service's Go
// heap that its last collection found live, and its resident set.
const (
	resourceHeapLive = "service Go heap live (after a collection)"
	resourceRSS      = "service resident memory"
)

func (r *Report) resourceSummaries() []ResourceSummary {
	mixed := r.mixedSamples()
	get := []struct {
		name string
		f    func(Sample) int64
	}{
		{"Redis used_memory", func(s Sample) int64 { return s.RedisMemory }},
		{"Postgres database size", func(s Sample) int64 { return s.PostgresSize }},
		{"service Go heap in use", func(s Sample) int64 { return s.Heap }},
		{"NATS server resident memory", func(s Sample) int64 { return s.NATSMemory }},
		{resourceHeapLive, func(s Sample) int64 { return s.HeapLive }},
		{resourceRSS, func(s Sample) int64 { return s.RSS }},
	}
	var out []ResourceSummary
	for _, g := range get {
		rs := ResourceSummary{Name: g.name, Start: -1, End: -1}
		if len(mixed) > 0 {
			rs.Start, rs.End = quarterMean(mixed, g.f, true), quarterMean(mixed, g.f, false)
			// The quarters' middles are three quarters of the span apart.
			span := (mixed[len(mixed)-1].At - mixed[0].At).Minutes() * 3 / 4
			if rs.Start >= 0 && rs.End >= 0 && span > 0 {
				rs.GrowthPerMin = float64(rs.End-rs.Start) / span
			}
		}
		out = append(out, rs)
	}
	return out
}

// quarterMean is the mean of the known values of the first (or last) quarter
// of the samples, which smooths a garbage-collected heap's saw-tooth; -1 if
// none is known.
func quarterMean(ss []Sample, f func(Sample) int64, first bool) int64 {
	n := max(1, len(ss)/4)
	part := ss[:n]
	if !first {
		part = ss[len(ss)-n:]
	}
	var sum, known int64
	for _, s := range part {
		if v := f(s); v >= 0 {
			sum += v
			known++
		}
	}
	if known == 0 {
		return -1
	}
	return sum / known
}

func (r *Report) ratios(s Summary) []Ratio {
	ratio := func(service, limit string, sr, lr float64) Ratio {
		x := Ratio{Service: service, Limit: limit, ServiceRate: sr, LimitRate: lr}
		if lr > 0 {
			x.Ratio = sr / lr
		}
		return x
	}
	return []Ratio{
		ratio("commands answered 202/s (mixed phase)", "JetStream async publish/s", s.CommandRate, s.Raw.Publish),
		ratio("fan-out inbox writes/s asked by the posts (mixed phase)", "pipelined Redis ZADD/s", s.FanoutRate, s.Raw.ZAdd),
		ratio("read model projector, peak events applied/s", "JetStream ordered consume/s", s.Projectors[0].PeakRate, s.Raw.Consume),
		ratio("feeds projector, peak events applied/s", "JetStream ordered consume/s", s.Projectors[1].PeakRate, s.Raw.Consume),
	}
}

func (r *Report) targets(s Summary) []TargetCheck {
	c := r.Config
	post := s.Commands[kindPost]
	fresh := func(f FreshSummary, limit time.Duration) TargetCheck {
		return TargetCheck{
			Target:   fmt.Sprintf("freshness p99 ≤ %s, %s authors, at %.0f posts/s", fmtDuration(limit), strings.Fields(f.Authors)[0], c.PostRate),
			Measured: fmt.Sprintf("p99 %s over %d samples, %d not seen in %s; %.0f posts/s", fmtDuration(f.P99), f.Samples, f.Missed, fmtDuration(c.FreshTimeout), post.Rate),
			Met:      f.Samples > 0 && f.Missed == 0 && f.P99 <= limit && post.Rate >= 0.95*c.PostRate,
		}
	}
	reads := s.Feed[1]
	out := []TargetCheck{
		fresh(s.Fresh[0], 250*time.Millisecond),
		fresh(s.Fresh[1], 2*time.Second),
		{
			Target:   fmt.Sprintf("GET /feed p99 ≤ 10 ms at %.0f cached pages/s", c.CachedReadRate),
			Measured: fmt.Sprintf("p99 %s at %.0f/s, %.1f %% from the cache", fmtDuration(reads.P99), reads.Rate, 100*reads.HitRatio),
			Met:      reads.P99 <= 10*time.Millisecond && reads.Rate >= 0.95*c.CachedReadRate,
		},
		{
			Target:   "no error",
			Measured: fmt.Sprintf("%d failed, %d not sent (generator at its in-flight bound)", s.Errors, s.Dropped),
			Met:      s.Errors == 0 && s.Dropped == 0,
		},
		r.recovered(s),
	}
	if c.Viewers > 0 {
		announce := func(a FreshSummary, limit time.Duration) TargetCheck {
			return TargetCheck{
				Target:   fmt.Sprintf("announcement p99 ≤ %s, %s authors, to %d open streams", fmtDuration(limit), strings.Fields(a.Authors)[0], c.Viewers),
				Measured: fmt.Sprintf("p99 %s over %d announcements", fmtDuration(a.P99), a.Samples),
				Met:      a.Samples > 0 && a.P99 <= limit,
			}
		}
		out = append(out, announce(s.Announce[0], 100*time.Millisecond), announce(s.Announce[1], 250*time.Millisecond))
	}
	live, rss := s.resource(resourceHeapLive), s.resource(resourceRSS)
	flat := func(rs ResourceSummary) bool { return rs.Start > 0 && float64(rs.End) <= 1.2*float64(rs.Start) }
	out = append(out, TargetCheck{
		Target: "service memory flat (its live Go heap and its resident memory, first vs last quarter of the mixed phase, within 20 %)",
		Measured: fmt.Sprintf("live heap %s → %s, resident %s → %s",
			fmtBytes(live.Start), fmtBytes(live.End), fmtBytes(rss.Start), fmtBytes(rss.End)),
		Met: flat(live) && flat(rss),
	})
	return out
}

// resource is the row named name of the resources, unknown if there is none.
func (s Summary) resource(name string) ResourceSummary {
	if i := slices.IndexFunc(s.Resources, func(rs ResourceSummary) bool { return rs.Name == name }); i >= 0 {
		return s.Resources[i]
	}
	return ResourceSummary{Name: name, Start: -1, End: -1}
}

func (r *Report) recovered(s Summary) TargetCheck {
	t := TargetCheck{Target: "no projector falling behind without recovering"}
	if r.DrainError != "" {
		t.Measured = "not caught up: " + r.DrainError
		return t
	}
	t.Measured = fmt.Sprintf("lag at most %.0f / %.0f events (read model / feeds) in the mixed phase; all applied %s after it",
		s.Projectors[0].LagMax, s.Projectors[1].LagMax, fmtDuration(r.Drain))
	t.Met = r.Drain < r.Config.DrainTimeout
	return t
}

func fmtDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

func fmtBytes(b int64) string {
	switch {
	case b < 0:
		return "unknown"
	case b < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	default:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
}

func fmtRate(v float64) string {
	if v == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f", v)
}

// WriteJSON writes the summary as JSON (durations in nanoseconds).
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r.Summary()); err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	return nil
}
