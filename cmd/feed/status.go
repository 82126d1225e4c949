package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/readmodel"
)

// statusReport is what `feed status` prints. A nil figure is unavailable; the
// matching error says why.
type statusReport struct {
	Stream        string            `json:"stream"`
	Head          *uint64           `json:"head"`
	HeadError     string            `json:"head_error,omitempty"`
	Projectors    []projectorStatus `json:"projectors"`
	FanoutBacklog *uint64           `json:"fanout_backlog"`
	FanoutError   string            `json:"fanout_error,omitempty"`
}

// projectorStatus is one projector's progress through the log.
type projectorStatus struct {
	Name string `json:"name"`
	// Position is the last log sequence the projector's output reflects.
	Position *uint64 `json:"position"`
	// Planned is, for the feeds, the planner's own position (Position is the
	// appliers'): the work up to it is planned, though perhaps not yet applied.
	Planned     *uint64  `json:"planned,omitempty"`
	Lag         *uint64  `json:"lag"`
	Rate        *float64 `json:"rate"` // events/s over the sample interval
	DeadLetters *uint64  `json:"dead_letters"`
	Error       string   `json:"error,omitempty"`
}

// statusConns is what status reads from; a nil one could not be reached.
type statusConns struct {
	js     jetstream.JetStream
	pg     *pgxpool.Pool
	feeds  *feeds.Store
	errs   map[string]string // component → why unavailable
	closes []func()
}

func (c *statusConns) close() {
	for i := len(c.closes) - 1; i >= 0; i-- {
		c.closes[i]()
	}
}

// connectStatus connects to every component it can within the context's time.
func connectStatus(ctx context.Context, cfg config) *statusConns {
	c := &statusConns{errs: map[string]string{}}
	natsURL := natsURLOf(cfg)
	if nc, err := nats.Connect(natsURL, nats.Name("feed status"), nats.Timeout(2*time.Second)); err != nil {
		c.errs["nats"] = fmt.Sprintf("connect nats %s: %v", natsURL, err)
	} else {
		c.closes = append(c.closes, nc.Close)
		if c.js, err = jetstream.New(nc); err != nil {
			c.errs["nats"] = fmt.Sprintf("jetstream: %v", err)
		}
	}

	redisURL := redisURLOf(cfg)
	if opts, err := redis.ParseURL(redisURL); err != nil {
		c.errs["redis"] = fmt.Sprintf("parse REDIS_URL: %v", err)
	} else {
		rdb := redis.NewClient(opts)
		c.closes = append(c.closes, func() { _ = rdb.Close() })
		if err := rdb.Ping(ctx).Err(); err != nil {
			c.errs["redis"] = fmt.Sprintf("ping redis %s: %v", opts.Addr, err)
		} else {
			c.feeds = feeds.NewStore(rdb, feeds.Config{})
		}
	}

	databaseURL := databaseURLOf(cfg)
	if pg, err := readmodel.OpenPool(ctx, databaseURL, migrations.Schema, 0); err != nil {
		c.errs["postgres"] = fmt.Sprintf("connect postgres: %v", err)
	} else {
		c.closes = append(c.closes, pg.Close)
		if err := pg.Ping(ctx); err != nil {
			c.errs["postgres"] = fmt.Sprintf("ping postgres: %v", err)
		} else {
			c.pg = pg
		}
	}
	return c
}

// sample is the positions at one instant; nil entries are unavailable.
type sample struct {
	at        time.Time
	readmodel *uint64
	planned   *uint64
	applied   *uint64
	errs      map[string]string
}

func (c *statusConns) sample(ctx context.Context) sample {
	s := sample{at: time.Now(), errs: map[string]string{}}
	if c.pg == nil {
		s.errs[readmodel.ProjectorName] = "postgres unavailable: " + c.errs["postgres"]
	} else {
		var pos int64
		err := c.pg.QueryRow(ctx, `SELECT position FROM projector_checkpoints WHERE projector = $1`,
			readmodel.ProjectorName).Scan(&pos)
		if errors.Is(err, pgx.ErrNoRows) {
			err, pos = nil, 0
		}
		if err != nil {
			s.errs[readmodel.ProjectorName] = fmt.Sprintf("read checkpoint: %v", err)
		} else {
			s.readmodel = ptr(uint64(pos))
		}
	}
	if c.feeds == nil {
		s.errs[fanout.PlannerName] = "redis unavailable: " + c.errs["redis"]
		return s
	}
	store, err := c.feeds.Active(ctx)
	if err != nil {
		s.errs[fanout.PlannerName] = err.Error()
		return s
	}
	planned, err := fanout.PlannerPosition(ctx, store)
	if err != nil {
		s.errs[fanout.PlannerName] = err.Error()
		return s
	}
	s.planned = &planned
	if c.js == nil {
		s.errs[fanout.PlannerName] = "nats unavailable: " + c.errs["nats"]
		return s
	}
	if _, err := c.js.Stream(ctx, fanout.FanoutStream); errors.Is(err, jetstream.ErrStreamNotFound) {
		// No planner has run against this server: no work can be pending.
		s.applied = &planned
		return s
	}
	applied, err := fanout.Position(ctx, store, c.js)
	if err != nil {
		s.errs[fanout.PlannerName] = err.Error()
		return s
	}
	s.applied = &applied
	return s
}

// streamCount is the number of messages in a stream (on subjects matching
// filter, if given); a stream that does not exist has none.
func streamCount(ctx context.Context, js jetstream.JetStream, name, filter string) (uint64, error) {
	stream, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", name, err)
	}
	if filter == "" {
		info, err := stream.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("stream %s info: %w", name, err)
		}
		return info.State.Msgs, nil
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return 0, fmt.Errorf("stream %s info for %s: %w", name, filter, err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n, nil
}

func ptr[T any](v T) *T { return &v }

// status prints how far each projector is behind the log.
func status(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	interval := fs.Duration("interval", time.Second, "how long to sample the rates over")
	if err := fs.Parse(args); err != nil {
		return flagError("status", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: status: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if *interval <= 0 {
		return fmt.Errorf("%w: status: --interval %s must be a positive duration such as 1s", errUsage, *interval)
	}
	cfg, err := parseConfig(getenv)
	if err != nil {
		return err
	}

	connectCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	conns := connectStatus(connectCtx, cfg)
	cancel()
	defer conns.close()

	first := conns.sample(ctx)
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(*interval):
	}
	last := conns.sample(ctx)

	rep := statusReport{Stream: cfg.StreamName}
	if conns.js == nil {
		rep.HeadError = "nats unavailable: " + conns.errs["nats"]
		rep.FanoutError = rep.HeadError
	} else {
		if stream, err := conns.js.Stream(ctx, cfg.StreamName); err != nil {
			rep.HeadError = fmt.Sprintf("stream %s: %v", cfg.StreamName, err)
		} else if info, err := stream.Info(ctx); err != nil {
			rep.HeadError = fmt.Sprintf("stream %s info: %v", cfg.StreamName, err)
		} else {
			rep.Head = ptr(info.State.LastSeq)
		}
		if n, err := streamCount(ctx, conns.js, fanout.FanoutStream, ""); err != nil {
			rep.FanoutError = err.Error()
		} else {
			rep.FanoutBacklog = &n
		}
	}

	seconds := last.at.Sub(first.at).Seconds()
	add := func(name string, pos0, pos1, planned *uint64) {
		p := projectorStatus{Name: name, Position: pos1, Planned: planned, Error: last.errs[name]}
		if pos1 != nil && rep.Head != nil {
			p.Lag = ptr(*rep.Head - min(*pos1, *rep.Head))
		}
		if pos0 != nil && pos1 != nil && seconds > 0 {
			p.Rate = ptr(float64(*pos1-min(*pos0, *pos1)) / seconds)
		}
		if conns.js != nil {
			n, err := streamCount(ctx, conns.js, projections.DeadLetterStream, "deadletter."+name+".>")
			if err != nil && p.Error == "" {
				p.Error = err.Error()
			} else if err == nil {
				p.DeadLetters = &n
			}
		}
		rep.Projectors = append(rep.Projectors, p)
	}
	add(readmodel.ProjectorName, first.readmodel, last.readmodel, nil)
	add(fanout.PlannerName, first.applied, last.applied, last.planned)

	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return printStatus(stdout, rep)
}

func printStatus(w io.Writer, rep statusReport) error {
	num := func(v *uint64) string {
		if v == nil {
			return "unavailable"
		}
		return strconv.FormatUint(*v, 10)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "stream %s\thead %s\t\n", rep.Stream, num(rep.Head))
	fmt.Fprintln(tw, "PROJECTOR\tPOSITION\tPLANNED\tLAG\tRATE/S\tDEAD LETTERS\tNOTE")
	for _, p := range rep.Projectors {
		planned, rate := "-", "unavailable"
		if p.Planned != nil {
			planned = num(p.Planned)
		}
		if p.Rate != nil {
			rate = strconv.FormatFloat(*p.Rate, 'f', 1, 64)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			p.Name, num(p.Position), planned, num(p.Lag), rate, num(p.DeadLetters), p.Error)
	}
	fmt.Fprintf(tw, "fan-out backlog\t%s\t%s\n", num(rep.FanoutBacklog), rep.FanoutError)
	if rep.HeadError != "" {
		fmt.Fprintf(tw, "stream\t\t%s\n", rep.HeadError)
	}
	return tw.Flush()
}
