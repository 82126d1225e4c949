package loadbench

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// kind is a kind of request the bench sends.
type kind int

const (
	kindPost kind = iota
	kindFollow
	kindUnfollow
	kindLike
	kindComment
	kindFeed     // GET /feed, first page
	kindFeedNext // GET /feed?cursor=
	kindPoll     // the freshness poller's reads
	numKinds
)

var kindNames = [numKinds]string{
	"POST /posts", "POST /users/{id}/follow", "DELETE /users/{id}/follow", "POST /posts/{id}/like",
	"POST /posts/{id}/comments", "GET /feed (first page)", "GET /feed?cursor= (next page)", "GET /feed (freshness polls)",
}

func (k kind) String() string { return kindNames[k] }

func (k kind) isCommand() bool { return k <= kindComment }

// kindStats are one kind's outcomes in one phase.
type kindStats struct {
	latency  *Histogram // from the intended send time to the answer
	ok, errs atomic.Int64

	mu       sync.Mutex
	examples map[string]int // a few distinct errors, with their counts
}

const maxErrorExamples = 5

func (s *kindStats) fail(err error) {
	s.errs.Add(1)
	msg := err.Error()
	var se *statusError
	if errors.As(err, &se) {
		msg = se.Error()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.examples[msg]; ok || len(s.examples) < maxErrorExamples {
		s.examples[msg]++
	}
}

// phase is what one phase of the run recorded.
type phase struct {
	name       string
	start, end time.Time
	kinds      [numKinds]*kindStats
	// dropped counts arrivals not sent because MaxInFlight requests were
	// outstanding: the generator, not the service, was the limit.
	dropped atomic.Int64
	// skipped counts arrivals with nothing to act on (a like before any post).
	skipped atomic.Int64
	// fanout is the inbox writes the accepted posts asked for: each post of an
	// author below the big-account threshold is pushed into every follower's
	// (materialised) inbox.
	fanout atomic.Int64
	// late is how long after its intended time each request's goroutine
	// started: the generator's own delay (its timer's, the scheduler's), part
	// of every latency it records.
	late *Histogram

	// reads and slowReads count the phase's GET /feed reads (not the
	// poller's), and those slower than slowRead, by slowWindow of their
	// intended send times.
	reads, slowReads []atomic.Int64

	fresh freshness
	// announce is the time from a post's 202 to its event on a viewer's
	// stream, by kind of author.
	announce freshness
	// before and after are the service's metrics at the phase's ends;
	// schedBefore and schedAfter this process's scheduling latencies.
	before, after           metricSet
	schedBefore, schedAfter schedSnapshot
}

// slowRead is the latency above which a read is slow (the p99
// target for cached pages); slowWindow the span of send times by which slow
// reads are counted, to tell stalls (slow reads crowded in a few windows)
// from a queue (spread over many).
const (
	slowRead   = 10 * time.Millisecond
	slowWindow = 100 * time.Millisecond
)

func newPhase(name string, start, end time.Time) *phase {
	p := &phase{name: name, start: start, end: end, late: NewHistogram()}
	n := max(0, int(end.Sub(start)/slowWindow)) + 1
	p.reads, p.slowReads = make([]atomic.Int64, n), make([]atomic.Int64, n)
	for k := range p.kinds {
		p.kinds[k] = &kindStats{latency: NewHistogram(), examples: map[string]int{}}
	}
	return p
}

// record files one request's outcome, its latency measured from intended.
func (p *phase) record(k kind, intended time.Time, err error) {
	s := p.kinds[k]
	if err != nil {
		s.fail(err)
		return
	}
	s.ok.Add(1)
	d := time.Since(intended)
	s.latency.Record(d)
	if k == kindFeed || k == kindFeedNext {
		if i := int(intended.Sub(p.start) / slowWindow); i >= 0 && i < len(p.reads) {
			p.reads[i].Add(1)
			if d > slowRead {
				p.slowReads[i].Add(1)
			}
		}
	}
}

// SlowReads is how a phase's reads slower than 10 ms fell over its 100 ms
// windows of send times.
type SlowReads struct {
	Slow, Reads int64
	// Windows is how many windows held any slow read, of All.
	Windows, All int
	// Worst is the most slow reads one window held, of WorstReads reads.
	Worst, WorstReads int64
}

func (p *phase) slowReadSummary() SlowReads {
	sr := SlowReads{All: len(p.reads)}
	for i := range p.reads {
		slow, reads := p.slowReads[i].Load(), p.reads[i].Load()
		sr.Slow += slow
		sr.Reads += reads
		if slow > 0 {
			sr.Windows++
		}
		if slow > sr.Worst {
			sr.Worst, sr.WorstReads = slow, reads
		}
	}
	return sr
}

// errors is the phase's failed requests of every kind.
func (p *phase) errors() int64 {
	var n int64
	for _, s := range p.kinds {
		n += s.errs.Load()
	}
	return n
}

// freshness holds the freshness samples of one phase.
type freshness struct {
	mu      sync.Mutex
	samples [2][]time.Duration // ordinary, big
	missed  [2]int             // polls that gave up
}

func (f *freshness) add(big bool, d time.Duration, seen bool) {
	i := 0
	if big {
		i = 1
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !seen {
		f.missed[i]++
		return
	}
	f.samples[i] = append(f.samples[i], d)
}

// sorted returns the samples of a class, ascending, and the missed count.
func (f *freshness) sorted(big bool) ([]time.Duration, int) {
	i := 0
	if big {
		i = 1
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Clone(f.samples[i])
	slices.Sort(out)
	return out, f.missed[i]
}
