package loadbench

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// reportWith is a report of a short run whose mixed phase has the samples
// that sample gives (i counts from 0).
func reportWith(n int, sample func(i int) Sample) *Report {
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &Report{
		Config:  Config{Duration: time.Duration(n) * time.Second, ReadDuration: time.Second, FreshTimeout: time.Second, DrainTimeout: time.Minute},
		Started: start, Finished: start.Add(time.Minute),
		Warmup: newPhase("warm-up", start, start),
		Mixed:  newPhase("mixed", start, start.Add(time.Duration(n)*time.Second)),
		Reads:  newPhase("reads", start, start.Add(time.Second)),
	}
	for i := range n {
		s := sample(i)
		s.At, s.Stage = time.Duration(i+1)*time.Second, "mixed"
		r.Samples = append(r.Samples, s)
	}
	return r
}

func knownSample(i int) Sample {
	return Sample{
		MachineCPU: 4, KernelCPU: 1, StealCPU: 0.1, DAMONCPU: 0.25, ProcessCPU: 1.5, RedisCPU: 0.5, PostgresCPU: 0.75, NATSCPU: 0.25, BenchCPU: 0.5,
		RedisMemory: 10 << 20, PostgresSize: 20 << 20, Heap: 30 << 20, NATSMemory: int64(40+i) << 20, Goroutines: 100,
		HeapLive: 8 << 20, RSS: 50 << 20,
	}
}

func cpuRow(t *testing.T, md, phase string) []string {
	t.Helper()
	_, table, _ := strings.Cut(md, "| phase | machine |")
	for line := range strings.SplitSeq(table, "\n") {
		if cells := strings.Split(line, " | "); strings.HasPrefix(line, "| "+phase+" | ") && len(cells) == 15 {
			return cells
		}
	}
	require.Failf(t, "no CPU row", "phase %s in\n%s", phase, md)
	return nil
}

func TestReportShowsTheNATSProcess(t *testing.T) {
	r := reportWith(8, knownSample)
	s := r.Summary()

	names := make([]string, len(s.Resources))
	for i, rs := range s.Resources {
		names[i] = rs.Name
	}
	assert.Equal(t, []string{"Redis used_memory", "Postgres database size", "service Go heap in use", "NATS server resident memory",
		"service Go heap live (after a collection)", "service resident memory"}, names)
	nats := s.Resources[3]
	assert.Equal(t, int64(40<<20)+(1<<19), nats.Start, "mean of the first quarter: 40 and 41 MiB")
	assert.Equal(t, int64(46<<20)+(1<<19), nats.End)
	assert.InDelta(t, 6.0*(1<<20)/(7.0*3/4/60), nats.GrowthPerMin, 1)
	assert.InDelta(t, 0.25, s.CPU[0].NATS, 1e-9)

	mem := s.Targets[len(s.Targets)-1]
	assert.Contains(t, mem.Target, "memory flat")
	assert.Equal(t, "live heap 8.0 MiB → 8.0 MiB, resident 50.0 MiB → 50.0 MiB", mem.Measured)
	assert.True(t, mem.Met)

	var b bytes.Buffer
	require.NoError(t, r.WriteMarkdown(&b))
	md := b.String()
	assert.Contains(t, md, "| stolen | DAMON | feed process | Redis | Postgres | NATS | bench | anything else |")
	assert.Contains(t, md, "| NATS server resident memory | 40.5 MiB | 46.5 MiB |")
	assert.Contains(t, md, "`feed nats`")
	row := cpuRow(t, md, "mixed")
	assert.Equal(t, []string{"4.00", "1.00", "0.10", "0.25", "1.50", "0.50", "0.75", "0.25", "0.50", "0.25"}, row[1:11],
		"anything else is the machine less the feed process, Redis, Postgres, NATS, the bench and DAMON; steal is apart")
}

func TestReportWithoutTheNATSProcess(t *testing.T) {
	// An external NATS_URL: NATS is unknown and stays in anything else. (And
	// no DAMON monitor runs.)
	r := reportWith(8, func(i int) Sample {
		s := knownSample(i)
		s.NATSCPU, s.NATSMemory, s.DAMONCPU = -1, -1, -1
		return s
	})
	s := r.Summary()
	assert.Negative(t, s.CPU[0].NATS, "unknown")
	assert.Equal(t, int64(-1), s.Resources[3].Start)

	var b bytes.Buffer
	require.NoError(t, r.WriteMarkdown(&b))
	md := b.String()
	assert.Contains(t, md, "| NATS server resident memory | unknown | unknown | unknown |")
	row := cpuRow(t, md, "mixed")
	assert.Equal(t, "none", row[4], "no DAMON monitor")
	assert.Equal(t, []string{"unknown", "0.50", "0.75"}, row[8:11])
}

func TestChartDrawsTheNATSMemory(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, reportWith(4, knownSample).WriteChart(&b))
	assert.True(t, bytes.HasPrefix(b.Bytes(), []byte("\x89PNG")))
}

// TestMemoryTargetReadsTheLiveHeapAndTheResidentSet: the heap in use swings
// with GOGC and does not decide; the live heap and the resident set each do.
// TestStepNamesClearEachOther: the short steps at a run's start take a row
// each, and a name far enough from the last on the top row goes back to it.
func TestStepNamesClearEachOther(t *testing.T) {
	rows := labelRows{width: 62}
	var got []int
	for _, x := range []float64{0, 2, 9, 10, 250, 550, 551} { // raw limits, graph, materialise, warm-up, mixed, drain, reads
		got = append(got, rows.place(x))
	}
	assert.Equal(t, []int{0, 1, 2, 3, 0, 0, 1}, got)
	rows = labelRows{width: 62}
	for range 5 {
		rows.place(0)
	}
	assert.Len(t, rows.last, 4, "at most four rows; a fifth name shares the row whose last name is furthest left")
}

func TestMemoryTargetReadsTheLiveHeapAndTheResidentSet(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sample func(i int, s *Sample)
		met    bool
	}{
		{"flat, heap in use swinging", func(i int, s *Sample) { s.Heap = int64(30+40*(i%2)) << 20 }, true},
		{"live heap grows", func(i int, s *Sample) { s.HeapLive = int64(8+i) << 20 }, false},
		{"resident set grows", func(i int, s *Sample) { s.RSS = int64(50+4*i) << 20 }, false},
		{"live heap unknown", func(_ int, s *Sample) { s.HeapLive = -1 }, false},
		{"resident set unknown", func(_ int, s *Sample) { s.RSS = -1 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := reportWith(8, func(i int) Sample {
				smp := knownSample(i)
				tc.sample(i, &smp)
				return smp
			}).Summary()
			mem := s.Targets[len(s.Targets)-1]
			require.Contains(t, mem.Target, "memory flat")
			assert.Equal(t, tc.met, mem.Met, mem.Measured)
		})
	}
}

func TestDisturbanceCountsTheSecondsOtherWorkTookACore(t *testing.T) {
	at := func(machine float64) Sample {
		return Sample{MachineCPU: machine, ProcessCPU: 1, RedisCPU: 0, PostgresCPU: 0, NATSCPU: 0, BenchCPU: 0}
	}
	var samples []Sample
	for range 5 {
		samples = append(samples, at(1)) // nothing else
	}
	for range 10 {
		samples = append(samples, at(2)) // a core of other work
	}
	for range 10 {
		samples = append(samples, at(1))
	}
	d := disturbance(samples)
	// Over five seconds the burst's mean is 0.2, 0.4, 0.6, 0.8, then 1.0 six
	// times, then 0.8, 0.6, 0.4, 0.2: twelve at 0.3 or more.
	assert.Equal(t, Disturbance{Seconds: 12, Known: 25, Peak: 1}, d)

	// A sample of unknown CPU starts the window again.
	unknown := at(1)
	unknown.MachineCPU = -1
	d = disturbance([]Sample{at(2), unknown, at(1), at(1)})
	assert.Equal(t, Disturbance{Seconds: 1, Known: 3, Peak: 1}, d)
}

func TestFanoutSummaryHasTheStagesOfThePhase(t *testing.T) {
	r := reportWith(4, knownSample)
	stages := func(planner, fetch, apply, rounds, repairs float64) string {
		return fmt.Sprintf(`# TYPE feed_projector_stage_seconds histogram
feed_projector_stage_seconds_sum{projector="feeds",stage="wait"} %[1]g
feed_projector_stage_seconds_count{projector="feeds",stage="wait"} %[1]g
feed_projector_stage_seconds_sum{projector="feeds-appliers",stage="fetch"} %[2]g
feed_projector_stage_seconds_count{projector="feeds-appliers",stage="fetch"} %[3]g
feed_projector_stage_seconds_sum{projector="feeds-appliers",stage="apply"} %[3]g
feed_projector_stage_seconds_count{projector="feeds-appliers",stage="apply"} %[3]g
feed_projector_stage_seconds_sum{projector="feeds-appliers",stage="round"} %[3]g
feed_projector_stage_seconds_count{projector="feeds-appliers",stage="round"} %[4]g
# TYPE feed_inbox_repairs_total counter
feed_inbox_repairs_total %[5]g
`, planner, fetch, apply, rounds, repairs)
	}
	// Before the phase: 2 batches, 4 messages, 3 repairs; after: 12, 14 and 5.
	r.Mixed.before = parseMetrics(t, stages(2, 1, 4, 40, 3))
	r.Mixed.after = parseMetrics(t, stages(12, 3, 14, 90, 5))
	f := r.Summary().Fanout
	assert.Equal(t, []StageSummary{{Name: "wait", Mean: time.Second}}, f.Stages)
	// Ten messages of the phase: 2 s of waits for them, 10 s of applying in
	// 50 round trips.
	assert.Equal(t, ApplierSummary{Known: true, Fetch: 200 * time.Millisecond, Apply: time.Second,
		Round: 200 * time.Millisecond, RoundsPerMessage: 5}, f.Appliers)

	var b bytes.Buffer
	require.NoError(t, r.WriteMarkdown(&b))
	assert.Contains(t, b.String(), "waiting for it 200.0 ms (idle time included), applying it 1.00 s, in 5.0 round trips to Redis of 200.0 ms each.")
	assert.InDelta(t, 2.0, f.Repairs, 0)
	assert.Contains(t, b.String(), "maintenance round repaired 2 inbox entries in the mixed phase")
}

// TestSlowReadsAreCountedByWindowOfSendTime: reads (first and next pages,
// not the poller's or commands) slower than 10 ms are counted in the 100 ms
// window of their intended send times, and the report says how they fell.
func TestSlowReadsAreCountedByWindowOfSendTime(t *testing.T) {
	now := time.Now()
	p := newPhase("reads", now.Add(-time.Second), now)
	require.Len(t, p.reads, 11)
	for range 3 {
		p.record(kindFeed, p.start.Add(50*time.Millisecond), nil) // ~950 ms late: window 0
	}
	p.record(kindFeedNext, p.start.Add(250*time.Millisecond), nil) // window 2
	p.record(kindPoll, p.start.Add(250*time.Millisecond), nil)     // the poller's: not counted
	p.record(kindPost, p.start.Add(250*time.Millisecond), nil)     // a command: not counted
	p.record(kindFeed, p.start, fmt.Errorf("503"))                 // failed: counted as an error only
	p.record(kindFeed, p.start.Add(-time.Second), nil)             // before the phase: no window
	p.record(kindFeed, time.Now().Add(time.Hour), nil)             // not yet due: fast, and no window
	for range 5 {
		p.record(kindFeed, time.Now(), nil) // fast: in the last window, not slow
	}
	sr := p.slowReadSummary()
	assert.Equal(t, SlowReads{Slow: 4, Reads: 9, Windows: 2, All: 11, Worst: 3, WorstReads: 3}, sr)

	r := reportWith(4, knownSample)
	r.Reads = p
	var b bytes.Buffer
	require.NoError(t, r.WriteMarkdown(&b))
	assert.Contains(t, b.String(), "- reads: 4 of 9 (44.44 %), in 2 of 11 windows; the worst held 3 of its 3 reads.")
}

// schedMetrics is the service's go_sched_latencies_seconds with these
// cumulative counts at ≤ 0.9 ms, ≤ 10.5 ms and in all.
func schedMetrics(t *testing.T, le09, le105, all int) metricSet {
	return parseMetrics(t, fmt.Sprintf(`# TYPE go_sched_latencies_seconds histogram
go_sched_latencies_seconds_bucket{le="0.0009"} %d
go_sched_latencies_seconds_bucket{le="0.0105"} %d
go_sched_latencies_seconds_bucket{le="+Inf"} %d
go_sched_latencies_seconds_sum 0.5
go_sched_latencies_seconds_count %d
`, le09, le105, all, all))
}

// TestCPUShowsTheServicesRunQueueWait: the CPU table gives the bucket of the
// service's go_sched_latencies_seconds that holds the phase's p99.
func TestCPUShowsTheServicesRunQueueWait(t *testing.T) {
	r := reportWith(4, knownSample)
	r.Mixed.before = schedMetrics(t, 100, 100, 100)
	r.Mixed.after = schedMetrics(t, 1080, 1099, 1100)
	s := r.Summary()
	assert.Equal(t, "≤ 10.5 ms", s.CPU[0].ServiceSchedP99, "990 of the phase's 1 000 waits are within 10.5 ms")
	var b bytes.Buffer
	require.NoError(t, r.WriteMarkdown(&b))
	assert.Equal(t, "≤ 10.5 ms |", cpuRow(t, b.String(), "mixed")[14])
}

// TestMachineNotesNameTheDAMONMonitorsThatAreOn: a monitor that is on is
// named with its operations, sampling interval and schemes; one that is off,
// or a machine without DAMON, adds nothing.
func TestMachineNotesNameTheDAMONMonitorsThatAreOn(t *testing.T) {
	ctx := damonRoot + "/0/contexts/0/"
	root := fstest.MapFS{
		damonRoot + "/0/state":                       {Data: []byte("on\n")},
		ctx + "operations":                           {Data: []byte("paddr\n")},
		ctx + "monitoring_attrs/intervals/sample_us": {Data: []byte("500000\n")},
		ctx + "schemes/0/action":                     {Data: []byte("pageout\n")},
		damonRoot + "/1/state":                       {Data: []byte("off\n")},
		damonRoot + "/1/contexts/0/operations":       {Data: []byte("vaddr\n")},
		damonRoot + "/nr_kdamonds":                   {Data: []byte("2\n")},
	}
	notes := damonNotes(root)
	assert.Equal(t, []string{"DAMON monitor 0 is on (operations paddr, sampling every 500ms, schemes pageout)"}, notes)
	assert.Empty(t, damonNotes(fstest.MapFS{}), "no DAMON")

	r := reportWith(4, knownSample)
	r.MachineNotes = notes
	var b bytes.Buffer
	require.NoError(t, r.WriteMarkdown(&b))
	assert.Contains(t, b.String(), "; DAMON monitor 0 is on (operations paddr, sampling every 500ms, schemes pageout).\n")
}

func TestScaleDividesTheStoresGrowthByUsersAndEvents(t *testing.T) {
	r := reportWith(8, knownSample)
	r.Config.Users = 1000
	r.BeforeGraph = Mark{Position: 0, RedisData: 1 << 20, PostgresSize: 8 << 20}
	r.Materialised = Mark{Position: 10_000, RedisData: 1<<20 + 3_000_000, PostgresSize: 12 << 20}
	r.Drained = Mark{Position: 50_000, RedisData: 40 << 20, PostgresSize: 12<<20 + 20_000_000}

	s := r.Summary()
	assert.InDelta(t, 3000, s.Scale.RedisPerUser, 1e-9)
	assert.InDelta(t, 500, s.Scale.PostgresPerEvent, 1e-9)
	var md bytes.Buffer
	require.NoError(t, r.WriteMarkdown(&md))
	assert.Contains(t, md.String(), "| Redis memory per materialised user, graph built and inboxes warm, before any post | 3000 B |")
	assert.Contains(t, md.String(), "| Postgres database growth per event of the warm-up and mixed phase, once applied | 500 B |")

	// Without a drain the database does not yet hold every event; without
	// Redis' memory there is nothing to divide.
	r.DrainError = "still behind"
	r.BeforeGraph.RedisData = -1
	s = r.Summary()
	assert.InDelta(t, -1, s.Scale.RedisPerUser, 0)
	assert.InDelta(t, -1, s.Scale.PostgresPerEvent, 0)
}
