package repair

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
)

// RebuildConfig tunes a feeds rebuild; the zero value works.
type RebuildConfig struct {
	// Planner is the live planner's configuration (partitions, work message
	// size); the rebuild plans the same way into its own keyspace and stream.
	Planner fanout.PlannerConfig
	// Fresh discards the shadow an interrupted rebuild left instead of
	// resuming it.
	Fresh bool
	// Grace is how long the replaced keyspace stays after the switch, for the
	// readers and appliers that have not looked up the version since (default
	// 3s; they look at least once a second).
	Grace time.Duration
	// Lease is how long the rebuild lock outlives a rebuild that died (default
	// 30s); a running rebuild renews it.
	Lease time.Duration
}

func (c RebuildConfig) withDefaults() RebuildConfig {
	if c.Grace <= 0 {
		c.Grace = 3 * time.Second
	}
	if c.Lease <= 0 {
		c.Lease = 30 * time.Second
	}
	return c
}

// Rebuild is the feeds being rebuilt in the next keyspace version beside the
// one in use (a projections.Shadow): its own planner, on its own fan-out
// stream with its own appliers. The switch sets feed:version, which the live
// planner, appliers and readers follow.
type Rebuild struct {
	*fanout.Planner
	base     *feeds.Store
	js       jetstream.JetStream
	cfg      RebuildConfig
	logger   *slog.Logger
	old      int64
	version  int64
	token    string
	lost     atomic.Bool
	stop     context.CancelFunc
	wg       sync.WaitGroup
	closeOne sync.Once
}

// OpenRebuild takes the rebuild lock and opens the shadow keyspace: the one
// an interrupted rebuild left, to resume, or the next version. It finishes the
// cleanup of a rebuild that switched but died before removing the old version.
func OpenRebuild(ctx context.Context, store *feeds.Store, js jetstream.JetStream, cfg RebuildConfig, logger *slog.Logger) (_ *Rebuild, err error) {
	cfg = cfg.withDefaults()
	r := &Rebuild{base: store, js: js, cfg: cfg, logger: logger.With("component", "feeds-rebuild")}
	if err := r.lock(ctx); err != nil {
		return nil, err
	}
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	r.stop = stop
	r.wg.Go(func() { r.keepLease(bg) })
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	if err := r.open(ctx, cfg.Fresh); err != nil {
		return nil, err
	}
	r.Planner = fanout.NewShadowPlanner(store, js, cfg.Planner, r.version)
	if err := r.EnsureStream(ctx); err != nil {
		return nil, err
	}
	appliers := fanout.NewShadowApplier(store, js, r.Planner, logger)
	r.wg.Go(func() {
		if err := appliers.Run(bg); err != nil {
			r.logger.Error("rebuild appliers stopped", "err", err)
		}
	})
	return r, nil
}

// Version is the keyspace version the rebuild builds.
func (r *Rebuild) Version() int64 { return r.version }

func (r *Rebuild) lock(ctx context.Context) error {
	host, _ := os.Hostname()
	nonce := make([]byte, 6)
	_, _ = rand.Read(nonce)
	r.token = fmt.Sprintf("%s pid %d since %s (%s)", host, os.Getpid(), time.Now().UTC().Format(time.RFC3339), hex.EncodeToString(nonce))
	ok, err := r.base.Client().SetNX(ctx, feeds.RebuildLockKey, r.token, r.cfg.Lease).Result()
	if err != nil {
		return feeds.Fail("rebuild lock", err)
	}
	if !ok {
		holder, _ := r.base.Client().Get(ctx, feeds.RebuildLockKey).Result()
		return fmt.Errorf("%s: held by %s: %w", fanout.PlannerName, holder, projections.ErrRebuildRunning)
	}
	return nil
}

var renewLease = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0`)

var releaseLease = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
	return redis.call('DEL', KEYS[1])
end
return 0`)

// keepLease renews the lock until ctx ends; a lock found taken over (the
// lease ran out while Redis was unreachable) fails the rebuild's next batch.
func (r *Rebuild) keepLease(ctx context.Context) {
	tick := time.NewTicker(r.cfg.Lease / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n, err := renewLease.Run(ctx, r.base.Client(), []string{feeds.RebuildLockKey}, r.token, r.cfg.Lease.Milliseconds()).Int()
		if err == nil && n == 0 {
			r.lost.Store(true)
			r.logger.Error("the rebuild lock was lost; stopping")
			return
		}
	}
}

// open decides the shadow's version from the state a previous rebuild left.
func (r *Rebuild) open(ctx context.Context, fresh bool) error {
	active, err := r.base.ActiveVersion(ctx)
	if err != nil {
		return err
	}
	st, err := r.base.Client().HGetAll(ctx, feeds.RebuildKey).Result()
	if err != nil {
		return feeds.Fail("rebuild state", err)
	}
	prev, _ := strconv.ParseInt(st["version"], 10, 64)
	prevOld, _ := strconv.ParseInt(st["old"], 10, 64)
	switch {
	case prev != 0 && prev == active:
		// Switched, then died before removing the old version.
		r.logger.Info("finishing the cleanup of a rebuild that switched", "old", prevOld)
		if err := r.drop(ctx, prevOld, prev); err != nil {
			return err
		}
	case prev > active && !fresh:
		r.version, r.old = prev, active
		r.logger.Info("resuming a rebuild", "version", prev)
		return nil
	case prev != 0:
		// Discarded (fresh), or left from a version no longer in use.
		if err := r.drop(ctx, prev, prev); err != nil {
			return err
		}
	}
	r.version, r.old = active+1, active
	if err := r.base.Client().HSet(ctx, feeds.RebuildKey, "version", r.version, "old", r.old).Err(); err != nil {
		return feeds.Fail("rebuild state", err)
	}
	return nil
}

// drop removes keyspace version v, the fan-out stream of the rebuild that
// built version stream, and the rebuild's state.
func (r *Rebuild) drop(ctx context.Context, v, stream int64) error {
	if err := deleteVersion(ctx, r.base, v); err != nil {
		return err
	}
	err := r.js.DeleteStream(ctx, fanout.ShadowFanout(stream).Stream)
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("delete the rebuild's fan-out stream: %w", err)
	}
	if err := r.base.Client().Del(ctx, feeds.RebuildKey).Err(); err != nil {
		return feeds.Fail("rebuild state", err)
	}
	return nil
}

// deleteVersion removes every key of keyspace version v.
func deleteVersion(ctx context.Context, s *feeds.Store, v int64) error {
	iter := s.Client().Scan(ctx, 0, feeds.KeyPrefix(v)+"*", 1000).Iterator()
	keys := make([]string, 0, 1000)
	flush := func() error {
		if len(keys) == 0 {
			return nil
		}
		// One UNLINK per key: in a Redis Cluster they live in other slots.
		pipe := s.Client().Pipeline()
		for _, k := range keys {
			pipe.Unlink(ctx, k)
		}
		keys = keys[:0]
		if _, err := pipe.Exec(ctx); err != nil {
			return feeds.Fail(fmt.Sprintf("delete keyspace version %d", v), err)
		}
		return nil
	}
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == cap(keys) {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return feeds.Fail(fmt.Sprintf("scan keyspace version %d", v), err)
	}
	return flush()
}

// Apply implements projections.Projector on the shadow.
func (r *Rebuild) Apply(ctx context.Context, batch []events.Record) error {
	if r.lost.Load() {
		return fmt.Errorf("feeds rebuild: the lock was lost: %w", projections.ErrRebuildRunning)
	}
	return r.Planner.Apply(ctx, batch)
}

// Switch implements projections.Shadow: it builds in the shadow the inboxes
// that exist in the version in use, brings the shadow to the live planner's
// position, waits for its appliers to finish the work, and sets feed:version
// (only if it is still the version the rebuild started from). The live
// planner then resumes in the new version from the shadow's position,
// replaying whatever it had applied past it.
func (r *Rebuild) Switch(ctx context.Context, catchUp func(context.Context, uint64) error) error {
	if err := r.materialiseLive(ctx); err != nil {
		return err
	}
	live, err := fanout.PlannerPosition(ctx, r.base.At(r.old))
	if err != nil {
		return err
	}
	if err := catchUp(ctx, live); err != nil {
		return err
	}
	if err := r.drain(ctx); err != nil {
		return err
	}
	ok, err := switchVersion.Run(ctx, r.base.Client(), []string{feeds.VersionKey}, r.old, r.version).Int()
	if err != nil {
		return feeds.Fail("switch keyspace version", err)
	}
	if ok != 1 {
		return fmt.Errorf("feed:version is no longer %d: %w", r.old, domain.ErrConflict)
	}
	r.logger.Info("switched the feeds' keyspace version", "from", r.old, "to", r.version)
	return nil
}

var switchVersion = redis.NewScript(`
local cur = redis.call('GET', KEYS[1]) or '1'
if cur ~= ARGV[1] then
	return 0
end
redis.call('SET', KEYS[1], ARGV[2])
return 1`)

// materialiseLive asks the shadow planner for an inbox for every user who has
// one in the version in use, and waits for the requests to be taken.
func (r *Rebuild) materialiseLive(ctx context.Context) error {
	live := r.base.At(r.old)
	shadow := r.base.At(r.version)
	iter := live.Client().Scan(ctx, 0, live.Keys().InboxPattern(), 1000).Iterator()
	var users []domain.UserID
	for iter.Next(ctx) {
		if u, ok := live.Keys().InboxUser(iter.Val()); ok {
			users = append(users, u)
		}
	}
	if err := iter.Err(); err != nil {
		return feeds.Fail("list the materialised inboxes", err)
	}
	if err := shadow.RequestMaterialiseAll(ctx, users); err != nil {
		return err
	}
	for {
		n, err := r.Materialise(ctx, 1000)
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
	}
}

// drain waits until the shadow's appliers applied all its work.
func (r *Rebuild) drain(ctx context.Context) error {
	stream, err := r.js.Stream(ctx, r.Fanout().Stream)
	if err != nil {
		return fmt.Errorf("rebuild's fan-out stream: %w", err)
	}
	for {
		info, err := stream.Info(ctx)
		if err != nil {
			return fmt.Errorf("rebuild's fan-out stream: %w", err)
		}
		if info.State.Msgs == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Cleanup implements projections.Shadow: after the grace period it removes
// the replaced keyspace version and the rebuild's stream and state.
func (r *Rebuild) Cleanup(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(r.cfg.Grace):
	}
	r.stop()
	r.wg.Wait()
	return r.drop(ctx, r.old, r.version)
}

// Close stops the rebuild's appliers and releases its lock; what it built
// stays, to be resumed.
func (r *Rebuild) Close() {
	r.closeOne.Do(func() {
		r.stop()
		r.wg.Wait()
		_ = releaseLease.Run(context.Background(), r.base.Client(), []string{feeds.RebuildLockKey}, r.token).Err()
	})
}
