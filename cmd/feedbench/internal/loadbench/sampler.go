package loadbench

import (
	"context"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/procfs"
)

// Sample is the run's state at one tick of the sampler (once a second).
type Sample struct {
	// At is the time since the sampler started; Stage the step of the run.
	At    time.Duration
	Stage string
	// Commands and Reads are the commands answered 202 and the feed pages
	// read per second since the previous sample.
	Commands, Reads float64
	// Head is the log's last sequence; the lags are how many events of it each
	// projector has not applied yet, and the rates how many it applied per
	// second since the previous sample. Known is false when neither the
	// positions nor the metrics could be read.
	Head                     uint64
	ReadModelLag, FeedsLag   float64
	ReadModelRate, FeedsRate float64
	Known                    bool
	// PlannerLag is the feed planner's own lag (FeedsLag is the appliers');
	// FanoutRate the work messages it published per second and FanoutBacklog
	// those not yet applied. Known only from Target.Positions.
	PlannerLag, FanoutRate, FanoutBacklog float64
	KnownFanout                           bool
	// CPU since the previous sample, in cores (-1 unknown): the machine's,
	// the feed process's (the service, and the bench when it started the
	// service in its own process), Redis' (at most 1: it runs commands on one
	// thread), Postgres' and the NATS server's (the service's child process).
	MachineCPU, ProcessCPU, RedisCPU, PostgresCPU, NATSCPU float64
	// BenchCPU is the bench's own process's, when the service runs in a
	// process of its own (-1 otherwise: ProcessCPU holds both).
	BenchCPU float64
	// KernelCPU is the part of MachineCPU spent in the kernel (-1 unknown).
	KernelCPU float64
	// StealCPU is the time the hypervisor ran something else while the
	// machine had work (/proc/stat's steal, not in MachineCPU); DAMONCPU is
	// the kernel's DAMON monitors' threads (kdamond, part of MachineCPU).
	// -1 unknown, and DAMONCPU when no monitor runs.
	StealCPU, DAMONCPU float64
	// RedisMemory (used_memory), PostgresSize (the database), Heap (the
	// service's Go heap in use), HeapLive (what its last collection found
	// live), RSS (its resident set) and NATSMemory (the NATS server's resident
	// set) in bytes; -1 when unavailable.
	RedisMemory, PostgresSize, Heap, HeapLive, RSS, NATSMemory int64
	// Goroutines is the service's go_goroutines; -1 unknown.
	Goroutines int64
}

// OtherCPU is the machine's CPU that none of the processes the bench
// observes used (-1 unknown): work the run shared the machine with. NATS, the
// bench and DAMON's threads are subtracted when known (else they are part of
// it).
func (s Sample) OtherCPU() float64 {
	if s.MachineCPU < 0 || s.ProcessCPU < 0 || s.RedisCPU < 0 || s.PostgresCPU < 0 {
		return -1
	}
	return max(0, s.MachineCPU-s.ProcessCPU-s.RedisCPU-s.PostgresCPU-max(0, s.NATSCPU)-max(0, s.BenchCPU)-max(0, s.DAMONCPU))
}

// sampler takes a Sample every second until stopped.
type sampler struct {
	r       *runner
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
	samples []Sample
}

func startSampler(ctx context.Context, r *runner) *sampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &sampler{r: r, cancel: cancel, done: make(chan struct{})}
	go s.loop(ctx)
	return s
}

// stop ends the sampling and returns the samples; later calls return the
// same.
func (s *sampler) stop() []Sample {
	s.once.Do(func() {
		s.cancel()
		<-s.done
	})
	return s.samples
}

// prevState is what the next sample's rates are computed from.
type prevState struct {
	at                  time.Time
	commands, reads     int64
	readModel, applied  float64
	haveProjectorCounts bool
	fanoutSeq           uint64
	machine             cpuTimes
	// Cumulative CPU times by probe, as last read.
	cpu map[string]time.Duration
}

func (s *sampler) loop(ctx context.Context) {
	defer close(s.done)
	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	prev := prevState{at: start}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sctx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
		smp, next := s.take(sctx, start, prev)
		cancel()
		if ctx.Err() != nil {
			return
		}
		s.samples = append(s.samples, smp)
		prev = next
	}
}

func (s *sampler) take(ctx context.Context, start time.Time, prev prevState) (Sample, prevState) {
	now := time.Now()
	secs := now.Sub(prev.at).Seconds()
	next := prevState{at: now, commands: s.r.commandsDone.Load(), reads: s.r.readsDone.Load(), cpu: map[string]time.Duration{}}
	smp := Sample{
		At: now.Sub(start), Stage: s.r.stageName(),
		Commands:    float64(next.commands-prev.commands) / secs,
		Reads:       float64(next.reads-prev.reads) / secs,
		RedisMemory: -1, PostgresSize: -1, Heap: -1, HeapLive: -1, RSS: -1, NATSMemory: -1, Goroutines: -1,
		MachineCPU: -1, ProcessCPU: -1, RedisCPU: -1, PostgresCPU: -1, NATSCPU: -1, KernelCPU: -1, BenchCPU: -1,
		StealCPU: -1, DAMONCPU: -1,
	}
	if v, err := selfCPU(); err == nil {
		smp.BenchCPU = cpuRate("bench", v, prev, &next, secs)
	}
	if t, err := machineCPU(); err == nil {
		next.machine = t
		if p := prev.machine; p.total > 0 && t.total > p.total {
			cores := float64(runtime.NumCPU()) / float64(t.total-p.total)
			smp.MachineCPU = cores * float64(t.busy-p.busy)
			smp.KernelCPU = cores * float64(t.kernel-p.kernel)
			smp.StealCPU = cores * float64(t.steal-p.steal)
		}
	}
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if v, ok := kdamondCPU(fs); ok {
			smp.DAMONCPU = cpuRate("damon", v, prev, &next, secs)
		}
	}
	m, _ := s.r.api.metrics(ctx) // a failed scrape leaves the figures unknown
	if m != nil {
		for _, g := range []struct {
			name string
			dst  *int64
		}{
			{"go_memstats_heap_inuse_bytes", &smp.Heap},
			{"go_gc_heap_live_bytes", &smp.HeapLive},
			{"process_resident_memory_bytes", &smp.RSS},
		} {
			if v, ok := m[g.name]; ok && len(v.GetMetric()) > 0 {
				*g.dst = int64(m.sum(g.name))
			}
		}
		if v, ok := m["go_goroutines"]; ok && len(v.GetMetric()) > 0 {
			smp.Goroutines = int64(m.sum("go_goroutines"))
		}
		if v, ok := m["process_cpu_seconds_total"]; ok && len(v.GetMetric()) > 0 {
			smp.ProcessCPU = cpuRate("process", time.Duration(m.sum("process_cpu_seconds_total")*float64(time.Second)), prev, &next, secs)
		}
	}
	t := s.r.target
	if t.Positions != nil {
		if pos, err := t.Positions(ctx); err == nil {
			smp.Known, smp.Head = true, pos.Head
			smp.ReadModelLag = float64(pos.Head - min(pos.ReadModel, pos.Head))
			smp.FeedsLag = float64(pos.Head - min(pos.Applied, pos.Head))
			next.readModel, next.applied, next.haveProjectorCounts = float64(pos.ReadModel), float64(pos.Applied), true
			smp.PlannerLag = float64(pos.Head - min(pos.Planned, pos.Head))
			smp.FanoutBacklog, smp.KnownFanout = float64(pos.FanoutBacklog), true
			next.fanoutSeq = pos.FanoutSeq
			if prev.fanoutSeq > 0 {
				smp.FanoutRate = float64(pos.FanoutSeq-min(prev.fanoutSeq, pos.FanoutSeq)) / secs
			}
		}
	} else if m != nil {
		// The runner's own gauges: for the feeds, the planner's lag only.
		smp.Known = true
		smp.ReadModelLag = m.sum("feed_projector_lag_events", "projector", "readmodel")
		smp.FeedsLag = m.sum("feed_projector_lag_events", "projector", "feeds")
		next.readModel = m.sum("feed_projector_events_total", "projector", "readmodel")
		next.applied = m.sum("feed_projector_events_total", "projector", "feeds")
		next.haveProjectorCounts = true
	}
	if prev.haveProjectorCounts && next.haveProjectorCounts {
		smp.ReadModelRate = max(0, next.readModel-prev.readModel) / secs
		smp.FeedsRate = max(0, next.applied-prev.applied) / secs
	}
	for _, probe := range []struct {
		f   func(context.Context) (int64, error)
		dst *int64
	}{{t.RedisMemory, &smp.RedisMemory}, {t.NATSMemory, &smp.NATSMemory}} {
		if probe.f == nil {
			continue
		}
		if v, err := probe.f(ctx); err == nil {
			*probe.dst = v
		}
	}
	for _, probe := range []struct {
		name string
		f    func(context.Context) (time.Duration, error)
		dst  *float64
	}{{"redis", t.RedisCPU, &smp.RedisCPU}, {"postgres", t.PostgresCPU, &smp.PostgresCPU}, {"nats", t.NATSCPU, &smp.NATSCPU}} {
		if probe.f == nil {
			continue
		}
		if v, err := probe.f(ctx); err == nil {
			*probe.dst = cpuRate(probe.name, v, prev, &next, secs)
		}
	}
	if t.PostgresSize != nil {
		if v, err := t.PostgresSize(ctx); err == nil {
			smp.PostgresSize = v
		}
	}
	return smp, next
}

// cpuRate records a cumulative CPU time in next and returns the cores used
// since prev, or -1 without an earlier reading.
func cpuRate(name string, total time.Duration, prev prevState, next *prevState, secs float64) float64 {
	next.cpu[name] = total
	before, ok := prev.cpu[name]
	if !ok || total < before {
		return -1
	}
	return (total - before).Seconds() / secs
}
