package media

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/feedproject/feed/domain"
)

// Collectable is a store whose images can be listed and removed.
type Collectable interface {
	// Images calls fn with every stored image and when it was last saved.
	Images(ctx context.Context, fn func(Stored) error) error
	// Remove removes the images of keys last saved before cutoff and gives
	// their space back.
	Remove(ctx context.Context, keys []string, cutoff time.Time) (Reclaimed, error)
}

// Head is the event log's last position.
type Head interface {
	Head(ctx context.Context) (uint64, error)
}

// References tells which images posts reference: the read model.
type References interface {
	// Position is the log position the answers reflect.
	Position(ctx context.Context) (uint64, error)
	// MediaReferenced returns those of keys that a live post references, or
	// a post deleted at or after deletedSince.
	MediaReferenced(ctx context.Context, keys []string, deletedSince time.Time) (map[string]bool, error)
}

// CollectorConfig tunes a Collector; the zero value works.
type CollectorConfig struct {
	// Grace is how long an image is kept after it was last saved and after
	// the post that references it was deleted (default DefaultGrace). It
	// must exceed the longest time from an image's save to the append of its
	// post's event.
	Grace time.Duration
	// Interval is how often Run collects (default an hour).
	Interval time.Duration
	// CatchUp bounds the wait for the read model to apply the log's head
	// (default a minute).
	CatchUp time.Duration
	// Batch is how many keys one reference query checks (default 10 000).
	Batch int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// DefaultGrace is CollectorConfig.Grace's default.
const DefaultGrace = time.Hour

// Collection is what one collection did.
type Collection struct {
	// Position is the log position whose references were checked.
	Position uint64 `json:"position,string"`
	// Cutoff: only images last saved before it were considered.
	Cutoff time.Time `json:"cutoff"`
	// Considered is how many images were saved before the cutoff.
	Considered int `json:"considered"`
	// Removed is how many of them no post referenced and were removed.
	Removed int `json:"removed"`
	// ReclaimedBytes is how much smaller the store is.
	ReclaimedBytes int64 `json:"reclaimed_bytes"`
}

// Collector removes the images no post references: uploads of commands that
// were refused or failed, and images of posts deleted more than the grace
// ago. Keys are content hashes, so an image is removed only when no post
// references it, whichever uploaded it.
type Collector struct {
	store  Collectable
	log    Head
	refs   References
	cfg    CollectorConfig
	logger *slog.Logger
	// one collection at a time
	mu sync.Mutex
}

// NewCollector returns a collector of store's images, checked against refs
// once they have applied log's head.
func NewCollector(store Collectable, log Head, refs References, cfg CollectorConfig, logger *slog.Logger) *Collector {
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Hour
	}
	if cfg.CatchUp <= 0 {
		cfg.CatchUp = time.Minute
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 10_000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Collector{store: store, log: log, refs: refs, cfg: cfg, logger: logger}
}

// Collect removes the images last saved before now minus the grace that no
// post references. An image is saved before its post's event is appended,
// within the grace; so the post of any image old enough to be considered is
// in the log by the time collection starts, and collection reads the log's
// head and waits until the read model has applied it before it checks. An
// image saved again meanwhile (a new post with the same bytes) is kept by
// the store's own check. A read model that does not catch up in time is
// domain.ErrUnavailable, and nothing is removed.
func (c *Collector) Collect(ctx context.Context) (Collection, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	col := Collection{Cutoff: c.cfg.Now().Add(-c.cfg.Grace)}
	head, err := c.log.Head(ctx)
	if err != nil {
		return col, fmt.Errorf("collect images: %w", err)
	}
	col.Position = head
	if err := c.awaitReadModel(ctx, head); err != nil {
		return col, err
	}
	var orphans, batch []string
	seen := map[string]bool{}
	check := func() error {
		refd, err := c.refs.MediaReferenced(ctx, batch, col.Cutoff)
		if err != nil {
			return err
		}
		for _, key := range batch {
			if !refd[key] {
				orphans = append(orphans, key)
			}
		}
		batch = batch[:0]
		return nil
	}
	err = c.store.Images(ctx, func(st Stored) error {
		if !st.Saved.Before(col.Cutoff) || seen[st.Key] {
			return nil
		}
		seen[st.Key] = true
		col.Considered++
		batch = append(batch, st.Key)
		if len(batch) < c.cfg.Batch {
			return nil
		}
		return check()
	})
	if err == nil && len(batch) > 0 {
		err = check()
	}
	if err != nil {
		return col, fmt.Errorf("collect images: %w", err)
	}
	got, err := c.store.Remove(ctx, orphans, col.Cutoff)
	col.Removed, col.ReclaimedBytes = got.Images, got.Bytes
	if err != nil {
		return col, fmt.Errorf("collect images: %w", err)
	}
	return col, nil
}

// awaitReadModel waits until the references reflect the log up to head.
func (c *Collector) awaitReadModel(ctx context.Context, head uint64) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CatchUp)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		pos, err := c.refs.Position(ctx)
		if err == nil && pos >= head {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("collect images: read model position: %w", err)
			}
			return fmt.Errorf("collect images: the read model has applied the log to %d of %d within %s; nothing removed: %w",
				pos, head, c.cfg.CatchUp, domain.ErrUnavailable)
		case <-tick.C:
		}
	}
}

// Run collects every Interval until ctx ends, logging what each collection
// did; a failed one is logged and tried again at the next.
func (c *Collector) Run(ctx context.Context) error {
	tick := time.NewTicker(c.cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		col, err := c.Collect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			c.logger.Warn("collect unreferenced images", "err", err)
			continue
		}
		c.logger.Info("collected unreferenced images", "position", col.Position, "considered", col.Considered,
			"removed", col.Removed, "reclaimed_bytes", col.ReclaimedBytes)
	}
}
