package stack

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections/activity"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/readmodel"
)

// Conns are read-only connections to a deployment's servers; a nil one could
// not be reached.
type Conns struct {
	JetStream jetstream.JetStream
	Postgres  *pgxpool.Pool
	Feeds     *feeds.Store
	// Errs says, by component (nats, redis, postgres), why it is unavailable.
	Errs   map[string]string
	closes []func()
}

// Close lets go of the connections.
func (c *Conns) Close() {
	for i := len(c.closes) - 1; i >= 0; i-- {
		c.closes[i]()
	}
}

// Connect connects to every component it can within the context's time.
func Connect(ctx context.Context, cfg Config) *Conns {
	c := &Conns{Errs: map[string]string{}}
	natsURL := cfg.NATSEndpoint()
	if nc, err := nats.Connect(natsURL, nats.Name("feed status"), nats.Timeout(2*time.Second)); err != nil {
		c.Errs["nats"] = fmt.Sprintf("connect nats %s: %v", natsURL, err)
	} else {
		c.closes = append(c.closes, nc.Close)
		if c.JetStream, err = jetstream.New(nc); err != nil {
			c.Errs["nats"] = fmt.Sprintf("jetstream: %v", err)
		}
	}

	if target, err := ParseRedisURL(cfg.RedisEndpoint()); err != nil {
		c.Errs["redis"] = err.Error()
	} else {
		rdb := target.Client(RedisTuning{})
		c.closes = append(c.closes, func() { _ = rdb.Close() })
		if err := rdb.Ping(ctx).Err(); err != nil {
			c.Errs["redis"] = fmt.Sprintf("ping redis %s: %v", target, err)
		} else if err := CheckRedisMode(ctx, target, rdb); err != nil {
			c.Errs["redis"] = err.Error()
		} else {
			c.Feeds = feeds.NewStore(rdb, feeds.Config{})
		}
	}

	databaseURL := cfg.DatabaseEndpoint()
	if pg, err := readmodel.OpenPool(ctx, databaseURL, migrations.Schema, 0); err != nil {
		c.Errs["postgres"] = fmt.Sprintf("connect postgres: %v", err)
	} else {
		c.closes = append(c.closes, pg.Close)
		if err := pg.Ping(ctx); err != nil {
			c.Errs["postgres"] = fmt.Sprintf("ping postgres: %v", err)
		} else {
			c.Postgres = pg
		}
	}
	return c
}

// Positions are the projectors' positions at one instant; a nil one is
// unavailable and Errs, by projector name, says why.
type Positions struct {
	At        time.Time
	ReadModel *uint64
	Activity  *uint64
	// Planned is the feed planner's own position, Applied the appliers'.
	Planned *uint64
	Applied *uint64
	Errs    map[string]string
}

// checkpoint reads the checkpoint of a projector whose state is in schema;
// nil, with the reason in errs, when it cannot.
func (c *Conns) checkpoint(ctx context.Context, schema, projector string, errs map[string]string) *uint64 {
	if c.Postgres == nil {
		errs[projector] = "postgres unavailable: " + c.Errs["postgres"]
		return nil
	}
	var pos int64
	err := c.Postgres.QueryRow(ctx, "SELECT position FROM "+pgx.Identifier{schema, "projector_checkpoints"}.Sanitize()+
		" WHERE projector = $1", projector).Scan(&pos)
	if errors.Is(err, pgx.ErrNoRows) {
		err, pos = nil, 0
	}
	if err != nil {
		errs[projector] = fmt.Sprintf("read checkpoint: %v", err)
		return nil
	}
	p := uint64(pos)
	return &p
}

// Positions reads how far the projectors are.
func (c *Conns) Positions(ctx context.Context) Positions {
	s := Positions{At: time.Now(), Errs: map[string]string{}}
	s.ReadModel = c.checkpoint(ctx, migrations.Schema, readmodel.ProjectorName, s.Errs)
	s.Activity = c.checkpoint(ctx, migrations.ActivitySchema, activity.ProjectorName, s.Errs)
	if c.Feeds == nil {
		s.Errs[fanout.PlannerName] = "redis unavailable: " + c.Errs["redis"]
		return s
	}
	store, err := c.Feeds.Active(ctx)
	if err != nil {
		s.Errs[fanout.PlannerName] = err.Error()
		return s
	}
	planned, err := fanout.PlannerPosition(ctx, store)
	if err != nil {
		s.Errs[fanout.PlannerName] = err.Error()
		return s
	}
	s.Planned = &planned
	if c.JetStream == nil {
		s.Errs[fanout.PlannerName] = "nats unavailable: " + c.Errs["nats"]
		return s
	}
	if _, err := c.JetStream.Stream(ctx, fanout.FanoutStream); errors.Is(err, jetstream.ErrStreamNotFound) {
		// No planner has run against this server: no work can be pending.
		s.Applied = &planned
		return s
	}
	applied, err := fanout.Position(ctx, store, c.JetStream)
	if err != nil {
		s.Errs[fanout.PlannerName] = err.Error()
		return s
	}
	s.Applied = &applied
	return s
}
