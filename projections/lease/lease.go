// Package lease lets several processes run the same projector role with one
// of them active at a time: each role (and each applier partition) is a
// lease in a JetStream key-value bucket, renewed by revision, and the
// revision that acquired it is an epoch that fences the holder's writes.
package lease

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/events"
)

// Bucket is the key-value bucket the leases are kept in.
const Bucket = "FEED_LEASES"

// DefaultTTL is how long a lease outlives its holder's last renewal.
const DefaultTTL = 5 * time.Second

// EnsureBucket creates or updates the lease bucket, whose age limit is the
// leases' TTL: a lease not renewed within it is gone, and another process
// takes it.
//
// A new bucket's revisions start at the current Unix time in milliseconds,
// not at 1: the stores remember the highest epoch that wrote to them, and a
// bucket made again (deleted, or on a new NATS) must still give its holders
// the higher epochs.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, ttl time.Duration, replicas int) (jetstream.KeyValue, error) {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      Bucket,
		Description: "Leases of the projector roles: which process is active, and the epoch that fences its writes.",
		History:     1,
		TTL:         ttl,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("lease bucket: %w", events.Classify(err))
	}
	stream, err := js.Stream(ctx, "KV_"+Bucket)
	if err != nil {
		return nil, fmt.Errorf("lease bucket: %w", events.Classify(err))
	}
	if stream.CachedInfo().State.LastSeq == 0 {
		start := uint64(time.Now().UnixMilli())
		if err := stream.Purge(ctx, jetstream.WithPurgeSequence(start)); err != nil {
			return nil, fmt.Errorf("lease bucket: start its revisions at %d: %w", start, events.Classify(err))
		}
	}
	return kv, nil
}

// Identity is this process's default name in the leases: its host and
// process id.
func Identity() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// Config holds the optional knobs of a process's leases; the zero value works.
type Config struct {
	// Process names this process in the leases and in status; default
	// Identity().
	Process string
	// TTL is how long a lease outlives its last renewal; default DefaultTTL.
	// It must be the bucket's (every process uses the same).
	TTL time.Duration
}

// Leases are one process's leases. The holder of a lease renews it every
// fifth of its TTL and holds it while a renewal succeeded within the TTL
// less a fifth: it stops its work before another process can take the
// lease (the server removes it a whole TTL after the last renewal).
type Leases struct {
	kv      jetstream.KeyValue
	process string
	// member tells this start of the process from any other, with the same
	// name or not: a lease is this process's only if it holds member.
	member  string
	ttl     time.Duration
	tick    time.Duration
	metrics *Metrics
	logger  *slog.Logger

	mu    sync.Mutex
	roles map[string]RoleState
}

// New returns the leases of this process in kv (see EnsureBucket). Its
// metrics go to metrics, which may be nil.
func New(kv jetstream.KeyValue, cfg Config, metrics *Metrics, logger *slog.Logger) *Leases {
	if cfg.Process == "" {
		cfg.Process = Identity()
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTTL
	}
	return &Leases{
		kv:      kv,
		process: cfg.Process,
		member:  rand.Text(),
		ttl:     cfg.TTL,
		tick:    cfg.TTL / 5,
		metrics: metrics,
		logger:  logger,
		roles:   map[string]RoleState{},
	}
}

// Process is this process's name in the leases.
func (l *Leases) Process() string { return l.process }

// RoleState is this process's part in a role, as /readyz reports it.
type RoleState struct {
	// State is "active" or "standby".
	State   string `json:"state"`
	Process string `json:"process"`
	// Holder is the active process as last seen (for appliers, none).
	Holder string `json:"holder,omitempty"`
	// Epoch is the lease's while active.
	Epoch uint64 `json:"epoch,omitempty"`
	// Partitions are, for appliers, the partitions this process holds, and
	// Members how many processes share them.
	Partitions []int `json:"partitions,omitempty"`
	Members    int   `json:"members,omitempty"`
}

// The states of a role.
const (
	Active  = "active"
	Standby = "standby"
)

// State is this process's part in role.
func (l *Leases) State(role string) RoleState {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.roles[role]; ok {
		return s
	}
	return RoleState{State: Standby, Process: l.process}
}

func (l *Leases) setState(role string, s RoleState) {
	s.Process = l.process
	l.mu.Lock()
	l.roles[role] = s
	l.mu.Unlock()
	l.metrics.state(role, s)
}

// value is what a lease holds.
type value struct {
	Process string `json:"process"`
	Member  string `json:"member"`
	// Epoch is the revision that acquired the lease: 0 in that revision
	// itself, which is not known before it is written.
	Epoch uint64 `json:"epoch,omitempty"`
}

func (l *Leases) value(epoch uint64) []byte {
	b, _ := json.Marshal(value{Process: l.process, Member: l.member, Epoch: epoch})
	return b
}

// term is one holding of a lease, from its acquisition until it is lost or
// let go.
type term struct {
	key   string
	epoch uint64
	rev   uint64
	// until is when the holder stops counting on it: a TTL less a tick after
	// the last renewal was sent.
	until time.Time
}

// errHeld is a lease another process holds.
var errHeld = errors.New("held by another process")

// tryAcquire takes the lease key if it is free, or is this process's
// already (its answer lost on the way); else errHeld, with the holder.
func (l *Leases) tryAcquire(ctx context.Context, key string) (*term, string, error) {
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, l.tick)
	defer cancel()
	rev, err := l.kv.Create(ctx, key, l.value(0))
	if err == nil {
		return &term{key: key, epoch: rev, rev: rev, until: sent.Add(l.ttl - l.tick)}, l.process, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, "", err
	}
	entry, err := l.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, "", errHeld // expired or let go meanwhile: the next try takes it
	}
	if err != nil {
		return nil, "", err
	}
	var v value
	_ = json.Unmarshal(entry.Value(), &v)
	if v.Member != l.member {
		return nil, v.Process, errHeld
	}
	// Ours: a creation or renewal whose answer was lost. No other process
	// took the lease since, so its epoch is still the highest. How long it
	// has left is not known here: a renewal says.
	epoch := v.Epoch
	if epoch == 0 {
		epoch = entry.Revision()
	}
	t := &term{key: key, epoch: epoch, rev: entry.Revision(), until: time.Now().Add(l.tick)}
	if !l.renew(ctx, t) {
		return nil, "", errHeld
	}
	return t, l.process, nil
}

// renew renews t. False: the lease is lost (another process has it, or no
// renewal succeeded in time); the holder stops its work.
func (l *Leases) renew(ctx context.Context, t *term) bool {
	sent := time.Now()
	if !sent.Before(t.until) {
		return false
	}
	deadline := sent.Add(l.tick)
	if t.until.Before(deadline) {
		deadline = t.until
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	rev, err := l.kv.Update(rctx, t.key, l.value(t.epoch), t.rev)
	if err == nil {
		t.rev, t.until = rev, sent.Add(l.ttl-l.tick)
		return true
	}
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound) {
		// A renewal whose answer was lost moved the revision; anything
		// else means the lease expired or was taken.
		if entry, gerr := l.kv.Get(rctx, t.key); gerr == nil {
			var v value
			if json.Unmarshal(entry.Value(), &v) == nil && v.Member == l.member && v.Epoch == t.epoch {
				t.rev = entry.Revision()
				return true
			}
		}
		l.logger.Warn("lease lost to another process", "lease", t.key, "epoch", t.epoch)
		return false
	}
	if ctx.Err() != nil {
		return true // stopping: the holder lets go
	}
	l.logger.Warn("lease renewal failed", "lease", t.key, "err", err, "held_for", time.Until(t.until).Round(time.Millisecond))
	return time.Now().Before(t.until)
}

// release lets t go at once, so that a standby takes over without waiting
// for it to expire: only if this process still holds it.
func (l *Leases) release(ctx context.Context, t *term) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.tick)
	defer cancel()
	if err := l.kv.Delete(ctx, t.key, jetstream.LastRevision(t.rev)); err != nil {
		l.logger.Info("lease not let go; it expires", "lease", t.key, "err", err)
	}
}

// Hold runs work whenever this process holds the lease of role, until ctx
// ends; the rest of the time it stands by, trying for the lease every fifth
// of its TTL. work gets the lease's epoch, and a context that ends when the
// lease is lost (before another process can take it) or ctx ends; Hold
// waits for work to return before it lets the lease go. An error from work
// while ctx lasts lets the lease go and ends Hold with it.
func (l *Leases) Hold(ctx context.Context, role string, work func(ctx context.Context, epoch uint64) error) error {
	l.setState(role, RoleState{State: Standby})
	wait := time.NewTicker(l.tick)
	defer wait.Stop()
	for {
		t, holder, err := l.tryAcquire(ctx, role)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if !errors.Is(err, errHeld) {
				l.logger.Warn("cannot try for a lease", "lease", role, "err", err)
			}
			l.setState(role, RoleState{State: Standby, Holder: holder})
			select {
			case <-ctx.Done():
				return nil
			case <-wait.C:
			}
			continue
		}
		l.metrics.tookOver(role)
		l.logger.Info("active: took the lease", "role", role, "epoch", t.epoch)
		l.setState(role, RoleState{State: Active, Holder: l.process, Epoch: t.epoch})
		if err := l.keep(ctx, t, work); err != nil || ctx.Err() != nil {
			l.setState(role, RoleState{State: Standby})
			return err
		}
		l.metrics.lost(role)
		l.setState(role, RoleState{State: Standby})
		l.logger.Warn("standby: the lease was lost", "role", role, "epoch", t.epoch)
	}
}

// keep runs work while t is held, renewing it; it returns nil when the
// lease is lost (and work has returned) or ctx ended (and t is let go).
func (l *Leases) keep(ctx context.Context, t *term, work func(context.Context, uint64) error) error {
	termCtx, end := context.WithCancel(ctx)
	defer end()
	done := make(chan error, 1)
	go func() { done <- work(termCtx, t.epoch) }()
	tick := time.NewTicker(l.tick)
	defer tick.Stop()
	for {
		expiry := time.NewTimer(time.Until(t.until))
		select {
		case err := <-done:
			expiry.Stop()
			l.release(ctx, t)
			if ctx.Err() != nil {
				return nil
			}
			if err == nil {
				err = errors.New("stopped")
			}
			return fmt.Errorf("%s: %w", t.key, err)
		case <-ctx.Done():
			expiry.Stop()
			if err := <-done; err != nil {
				l.logger.Info("work stopped", "lease", t.key, "err", err)
			}
			l.release(ctx, t)
			return nil
		case <-tick.C:
			expiry.Stop()
			if l.renew(ctx, t) {
				continue
			}
		case <-expiry.C:
		}
		end()
		if err := <-done; err != nil {
			l.logger.Warn("work stopped with the lease", "lease", t.key, "err", err)
		}
		return nil
	}
}
