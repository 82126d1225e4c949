package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/feedproject/feed/cmd/feedbench/internal/loadbench"
)

// phaseProfiler asks the service, over its admin route /admin/pprof/, for a
// CPU profile of each measured phase and heap profiles of what is live at its
// start and end (as of the service's last collection: forcing one would
// stall the phase it measures), when cpu is set; and, when trace
// is, an execution trace of that long from the phase's start.
type phaseProfiler struct {
	ctx    context.Context // the run's: profiles still being taken stop with it
	base   string          // the service's URL
	token  string          // an admin bearer token
	dir    string
	cpu    bool
	trace  time.Duration
	phases map[string]time.Duration // each measured phase's length
	stderr io.Writer
	client *http.Client

	wg      sync.WaitGroup
	cpuDone chan struct{} // closed when the last CPU profile asked for is written
}

// benchProfiler is the profiler opts ask for of the service at base, whose
// tokens are signed with secret, or nil if they ask for none.
func benchProfiler(ctx context.Context, opts benchOptions, wl loadbench.Config, base, secret string, stderr io.Writer) (*phaseProfiler, error) {
	if !opts.cpuProfile && opts.trace == 0 {
		return nil, nil
	}
	mint, err := benchMinter(secret)
	if err != nil {
		return nil, err
	}
	token, err := mint(1, true)
	if err != nil {
		return nil, err
	}
	return &phaseProfiler{
		ctx: ctx, base: base, token: token, dir: opts.out, cpu: opts.cpuProfile, trace: opts.trace,
		phases: map[string]time.Duration{"mixed": wl.Duration, "reads": wl.ReadDuration},
		stderr: stderr, client: &http.Client{},
	}, nil
}

// onPhase starts the phase's profiles, or takes the heap at its end. Each is
// fetched in the background, so that the phase's own measurements start on
// time.
func (p *phaseProfiler) onPhase(phase string, start bool) {
	if start && p.trace > 0 {
		secs := strconv.FormatFloat(p.trace.Seconds(), 'f', -1, 64)
		p.fetch("trace-"+phase+".out", "trace?seconds="+secs, p.trace)
		fmt.Fprintf(p.stderr, "bench: tracing the service's %s phase for %s into %s\n", phase, p.trace, filepath.Join(p.dir, "trace-"+phase+".out"))
	}
	if !p.cpu {
		return
	}
	if !start {
		p.fetch("heap-"+phase+".pprof", "heap", 0)
		return
	}
	// What is live as the phase starts: `go tool pprof -base` of this and the
	// end's profile is what the phase added.
	p.fetch("heap-"+phase+"-start.pprof", "heap", 0)
	// The runtime takes one CPU profile at a time, and the last phase's may
	// still run (it outlasts its phase by up to a second, and a short run's
	// next phase can start sooner): this one waits for it, then covers what
	// is left of its phase, in whole seconds as pprof takes them.
	end := time.Now().Add(p.phases[phase])
	prev, done := p.cpuDone, make(chan struct{})
	p.cpuDone = done
	name := "cpu-" + phase + ".pprof"
	p.wg.Go(func() {
		defer close(done)
		if prev != nil {
			<-prev
		}
		secs := max(1, int(math.Ceil(time.Until(end).Seconds())))
		p.get(name, "profile?seconds="+strconv.Itoa(secs), time.Duration(secs)*time.Second)
	})
	fmt.Fprintf(p.stderr, "bench: profiling the service's %s phase into %s\n", phase, filepath.Join(p.dir, name))
}

// fetch writes the answer of /admin/pprof/<query> to name in the background;
// takes is how long the service records before it answers.
func (p *phaseProfiler) fetch(name, query string, takes time.Duration) {
	p.wg.Go(func() { p.get(name, query, takes) })
}

// get writes the answer of /admin/pprof/<query> to name, or says on stderr
// why it could not.
func (p *phaseProfiler) get(name, query string, takes time.Duration) {
	ctx, cancel := context.WithTimeout(p.ctx, takes+time.Minute)
	defer cancel()
	if err := p.write(ctx, query, filepath.Join(p.dir, name)); err != nil {
		fmt.Fprintf(p.stderr, "bench: profile %s: %v\n", name, err)
	}
}

func (p *phaseProfiler) write(ctx context.Context, query, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+"/admin/pprof/"+query, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+p.token)
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, body)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// wait waits for the profiles still being taken; nil waits for none.
func (p *phaseProfiler) wait() {
	if p != nil {
		p.wg.Wait()
	}
}
