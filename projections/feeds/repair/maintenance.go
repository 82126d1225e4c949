package repair

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/roundqueue"
)

// MaintenanceConfig holds the maintenance worker's knobs; the zero value works.
type MaintenanceConfig struct {
	// Period is how often one user's inbox is checked at most; default 10m.
	Period time.Duration
	// TTL drops users from the round after the inbox TTL; default 7 days.
	TTL time.Duration
	// Batch is how many users one pass takes, a pass a second; default 2.
	// Checking an inbox reads the outbox of every account its user follows
	// (a hundred on average in the bench, each up to its cap) and holds the
	// planner for that time: passes of 100 took seconds each once the
	// outboxes were full, and the planner fell behind by 20 000 events in a
	// soak as every inbox enrolled at the start came due at once. Two a
	// second check 1 200 inboxes every ten minutes.
	Batch int
}

// Maintenance visits the materialised inboxes in turn through a round queue
// (least recently checked first, each at most once per period) and has the
// planner reconcile them: trimmed if over-long, ghosts of deleted posts or
// unfollowed authors removed, missing posts added; feeds.Store.Repairs counts
// every entry it fixes. Users whose inboxes expire drop out by the queue's
// TTL.
type Maintenance struct {
	queue   *roundqueue.Queue
	store   *feeds.Store
	planner *fanout.Planner
	cfg     MaintenanceConfig
	logger  *slog.Logger
}

// NewMaintenance returns a maintenance worker; it enrolls every inbox the
// planner materialises.
func NewMaintenance(rdb redis.UniversalClient, store *feeds.Store, planner *fanout.Planner, cfg MaintenanceConfig, logger *slog.Logger) *Maintenance {
	if cfg.Period == 0 {
		cfg.Period = 10 * time.Minute
	}
	if cfg.TTL == 0 {
		cfg.TTL = store.Config().TTL
	}
	if cfg.Batch == 0 {
		cfg.Batch = 2
	}
	m := &Maintenance{
		queue:   roundqueue.New(rdb, "inboxes", roundqueue.Config{DequeuePeriod: cfg.Period, TTL: cfg.TTL}),
		store:   store,
		planner: planner,
		cfg:     cfg,
		logger:  logger.With("component", "inbox-maintenance"),
	}
	planner.OnMaterialise(m.Enroll)
	return m
}

// Enroll adds users to the round.
func (m *Maintenance) Enroll(ctx context.Context, users []domain.UserID) error {
	for _, u := range users {
		if _, err := m.queue.Enqueue(ctx, strconv.FormatInt(int64(u), 10), nil); err != nil {
			return fmt.Errorf("enroll inbox %d: %w", u, err)
		}
	}
	return nil
}

// Pass checks the inboxes that are due, at most Batch of them, one at a
// time: the planner waits for one inbox's check at most.
func (m *Maintenance) Pass(ctx context.Context) (int, error) {
	var users []domain.UserID
	for len(users) < m.cfg.Batch {
		id, _, ok, err := m.queue.Dequeue(ctx)
		if err != nil {
			return 0, err
		}
		if !ok {
			break
		}
		u, err := domain.ParseUserID(id)
		if err != nil {
			_, _ = m.queue.Remove(ctx, id)
			continue
		}
		users = append(users, u)
	}
	for _, u := range users {
		if err := m.planner.Reconcile(ctx, []domain.UserID{u}); err != nil {
			return 0, err
		}
	}
	return len(users), nil
}

// Run makes passes and cleans the round until ctx ends.
func (m *Maintenance) Run(ctx context.Context) error {
	cleaned := make(chan struct{})
	go func() {
		defer close(cleaned)
		for ctx.Err() == nil {
			if err := m.queue.RunCleaner(ctx); err != nil {
				m.logger.Warn("inbox maintenance cleaner", "err", err)
				time.Sleep(time.Second)
			}
		}
	}()
	defer func() { <-cleaned }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if _, err := m.Pass(ctx); err != nil && ctx.Err() == nil {
			m.logger.Warn("inbox maintenance pass", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
