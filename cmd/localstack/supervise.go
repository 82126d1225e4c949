package localstack

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Server is a child server a Supervisor keeps running: Redis, Postgres or a
// NATS process.
type Server interface {
	// Done is closed once the process has exited.
	Done() <-chan struct{}
	// ExitError describes how it exited, with its last output lines.
	ExitError() error
	// Stop stops it, and what is left of its process group.
	Stop() error
}

// SupervisorConfig bounds the restarts; the zero value works.
type SupervisorConfig struct {
	// MinBackoff is the wait before the first restart (default 250 ms); it
	// doubles with each failure in a row, up to MaxBackoff (default 8 s).
	MinBackoff, MaxBackoff time.Duration
	// MaxFailures within Window (default 5 within a minute) make the
	// supervisor give up: exits and failed restarts alike.
	MaxFailures int
	Window      time.Duration
}

func (c SupervisorConfig) withDefaults() SupervisorConfig {
	if c.MinBackoff <= 0 {
		c.MinBackoff = 250 * time.Millisecond
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = 8 * time.Second
	}
	if c.MaxFailures <= 0 {
		c.MaxFailures = 5
	}
	if c.Window <= 0 {
		c.Window = time.Minute
	}
	return c
}

// Supervisor restarts a child server that dies, with backoff, by the start
// function it was given (the same port and data directory), and gives up
// after repeated failures: Failed then says why.
type Supervisor struct {
	name   string
	start  func(context.Context) (Server, error)
	cfg    SupervisorConfig
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	failed chan error
	done   chan struct{}

	mu  sync.Mutex
	cur Server
}

// Supervise watches first, started already, and restarts it by start when it
// exits until Stop is called.
func Supervise(name string, first Server, start func(context.Context) (Server, error), cfg SupervisorConfig, log *slog.Logger) *Supervisor {
	ctx, cancel := context.WithCancel(context.Background())
	s := &Supervisor{
		name: name, start: start, cfg: cfg.withDefaults(), log: log, ctx: ctx, cancel: cancel,
		failed: make(chan error, 1), done: make(chan struct{}), cur: first,
	}
	go s.watch()
	return s
}

// Failed receives an error once the supervisor has given up on the server.
func (s *Supervisor) Failed() <-chan error { return s.failed }

// Stop ends the supervision and stops the server.
func (s *Supervisor) Stop() error {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.Stop()
}

func (s *Supervisor) watch() {
	defer close(s.done)
	var failures []time.Time
	backoff := s.cfg.MinBackoff
	for {
		s.mu.Lock()
		cur := s.cur
		s.mu.Unlock()
		began := time.Now()
		select {
		case <-s.ctx.Done():
			return
		case <-cur.Done():
		}
		if time.Since(began) >= s.cfg.Window {
			backoff = s.cfg.MinBackoff // it ran well: a new run of failures
		}
		err := cur.ExitError()
		_ = cur.Stop() // what is left of its process group
		for {
			now := time.Now()
			failures = append(failures, now)
			for len(failures) > 0 && now.Sub(failures[0]) > s.cfg.Window {
				failures = failures[1:]
			}
			if len(failures) >= s.cfg.MaxFailures {
				err = fmt.Errorf("%s failed %d times within %s; giving up: %w", s.name, len(failures), s.cfg.Window, err)
				s.log.Error(s.name+" keeps failing; giving up", "component", s.name, "err", err)
				s.failed <- err
				return
			}
			s.log.Error(s.name+" exited; restarting it", "component", s.name, "err", err, "in", backoff)
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, s.cfg.MaxBackoff)
			next, serr := s.start(s.ctx)
			if serr != nil {
				err = serr
				continue
			}
			s.mu.Lock()
			s.cur = next
			s.mu.Unlock()
			s.log.Warn(s.name+" restarted", "component", s.name)
			break
		}
	}
}
