package fanout

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
)

// PlannerName names the planner's checkpoint, durable consumer
// (projector-feeds) and metrics. Persisted: never rename it.
const PlannerName = "feeds"

// FanoutStream carries the planner's per-recipient work to the appliers, on
// subjects fanout.<partition>. It is derived state: rebuilt by a replay.
const FanoutStream = "FEED_FANOUT"

// Fanout names a fan-out stream and the root of its subjects
// (<Subject>.<partition>).
type Fanout struct{ Stream, Subject string }

// liveFanout is the live planner's; a rebuild has its own (ShadowFanout).
var liveFanout = Fanout{Stream: FanoutStream, Subject: "fanout"}

// ShadowFanout is the fan-out stream of the rebuild of keyspace version v.
func ShadowFanout(v int64) Fanout {
	return Fanout{Stream: fmt.Sprintf("%s_V%d", FanoutStream, v), Subject: fmt.Sprintf("fanout-v%d", v)}
}

// versionHeader carries, on each fan-out message, the keyspace version its
// work is for.
const versionHeader = "Feed-Version"

// errStateLost makes the runner rewind to the planner's stored position.
var errStateLost = errors.New("feed planner state lost")

// PlannerConfig holds the planner's optional knobs; the zero value works.
type PlannerConfig struct {
	// Partitions is how many appliers share the inboxes, by recipient; default 4.
	// Changing it needs the fan-out stream drained first.
	Partitions int
	// ItemsPerMessage bounds the work items in one fan-out message; default
	// 8 000. Under sync always each message is synced on its own, at publish
	// and again when applied work is removed (a tombstone, synced before the
	// partition's next message is delivered), so fewer larger messages spare
	// the disk and the appliers a wait each; an applier still applies a
	// message in script calls of bounded size (decision 23).
	ItemsPerMessage int
	// PendingWork, if above 0, is how many fan-out messages may wait for the
	// appliers before the planner plans more: after publishing a batch's work
	// it waits until no more than that are left. While the appliers keep up
	// it never waits. When they fall behind, the events that arrive while it
	// waits make its next batch larger, and a larger batch gives each
	// recipient a longer run of pushes a message, which Redis applies for a
	// fraction of a run of one or two's cost a push (apply.lua reads and
	// writes an inbox's meta once a run): so the appliers catch up instead of
	// falling further behind, and the work waiting stays bounded. Without it,
	// a planner a step ahead of busy appliers cut the work into the shortest
	// runs when they were the dearest. 0 (the zero value, for tests that
	// run a planner without appliers) never waits.
	PendingWork int
	// Replicas is the fan-out stream's replication factor, as the log's;
	// default 1.
	Replicas int

	// version pins a rebuild's planner to its keyspace version and fanout to
	// its own stream; the live planner (version 0) follows the version in use.
	version int64
	fanout  Fanout
}

func (c PlannerConfig) withDefaults() PlannerConfig {
	if c.Partitions == 0 {
		c.Partitions = 4
	}
	if c.ItemsPerMessage == 0 {
		c.ItemsPerMessage = 8000
	}
	if c.fanout == (Fanout{}) {
		c.fanout = liveFanout
	}
	return c
}

// Planner is the first stage of the feed projector. It follows the log in
// order, is the only writer of the follow graph and the outboxes, and turns
// each event into work for the recipients it concerns, in log order, on the
// recipient's partition. The work is complete in itself (a follow carries the
// followee's outbox as of that point of the log), so an applier never reads
// state another stage is changing, and a recipient's work is applied in the
// order of the log: an unfollow can never be overtaken by a push of the same
// author's post.
type Planner struct {
	// store is base's keyspace version this planner writes, changed only when
	// it resumes (Checkpoint).
	base, store *feeds.Store
	js          jetstream.JetStream
	cfg         PlannerConfig
	metrics     *projections.Metrics

	// mu serialises Apply and Materialise, so materialisation reads the graph
	// and outboxes as of a position of the log.
	mu sync.Mutex
	// applied is the position this planner last applied or resumed from: the
	// state in Redis is trusted only while its stored position equals it.
	applied uint64
	// enrolled, if set, hears of every inbox materialised (for maintenance).
	enrolled func(context.Context, []domain.UserID) error
	// beforePlan, when set (by tests), runs between a batch's first round
	// trip and its plan's.
	beforePlan func()
	// fanout is the fan-out stream, once looked up (for PendingWork).
	fanout jetstream.Stream
	// stall is how long the planner waits for appliers that apply nothing
	// (default appliersStall).
	stall time.Duration
	// online, if set, tells which recipients' work goes first.
	online Online
	// epoch is the lease's under which it moves its position (see Fence).
	epoch atomic.Uint64
}

// Online tells the planner the recipients that are online (holding a live
// stream, whose announcements they may follow with a read of the feed). Their
// work is published ahead of the others' in each partition, in messages of
// its own, which the partition's applier therefore applies first; each
// recipient's work keeps its order, since all of a batch's goes one way.
type Online interface {
	// Online returns the online users, nil if none; the planner only reads
	// it. It is called once a batch, so it must not wait on a round trip.
	Online() map[domain.UserID]struct{}
}

// ServeFirst makes the planner publish the work of online's users first.
func (p *Planner) ServeFirst(online Online) { p.online = online }

// OnMaterialise makes the planner tell f of the users whose inboxes it
// materialises.
func (p *Planner) OnMaterialise(f func(context.Context, []domain.UserID) error) { p.enrolled = f }

// NewPlanner returns the planner writing to store and publishing work with js.
// The live planner writes the keyspace version in use (see repair.Rebuild).
func NewPlanner(store *feeds.Store, js jetstream.JetStream, cfg PlannerConfig, metrics *projections.Metrics) *Planner {
	cfg = cfg.withDefaults()
	return &Planner{base: store, store: store.At(max(cfg.version, 1)), js: js, cfg: cfg, metrics: metrics}
}

// NewShadowPlanner returns the planner of a rebuild: it writes keyspace
// version v, whatever the version in use, and publishes its work on the
// rebuild's own stream (ShadowFanout).
func NewShadowPlanner(store *feeds.Store, js jetstream.JetStream, cfg PlannerConfig, v int64) *Planner {
	cfg.version, cfg.fanout = v, ShadowFanout(v)
	return NewPlanner(store, js, cfg, nil)
}

// Partitions is how many appliers share the planner's work.
func (p *Planner) Partitions() int { return p.cfg.Partitions }

// Fanout is the stream the planner publishes its work on.
func (p *Planner) Fanout() Fanout { return p.cfg.fanout }

// follows reports whether the planner follows the keyspace version in use.
func (p *Planner) follows() bool { return p.cfg.version == 0 }

// EnsureStream creates or updates the fan-out stream: a work queue per
// partition subject, so applied work is removed.
func (p *Planner) EnsureStream(ctx context.Context) error {
	_, err := p.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        p.cfg.fanout.Stream,
		Description: "Per-recipient feed work from the planner to the appliers.",
		Subjects:    []string{p.cfg.fanout.Subject + ".>"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    max(p.cfg.Replicas, 1),
		Duplicates:  10 * time.Minute,
		// Reads look at the oldest message's header for the feeds' position
		// (positionAfter): a direct get returns it as it is stored, where the
		// stream API wraps the whole message, some thousands of items, in
		// base64 inside JSON, which took a tenth of the API's CPU under load.
		AllowDirect: true,
	})
	if err != nil {
		return fmt.Errorf("fan-out stream: %w", events.Classify(err))
	}
	return nil
}

// Name implements projections.Projector.
func (p *Planner) Name() string { return PlannerName }

// Fence implements projections.Fenced: the planner's position moves under
// epoch from now on, and a planner that finds a newer epoch moved it stops
// before it plans or publishes (each batch reads the epoch with the
// position, and again after changing the graph), and cannot move it.
//
// Its changes of the graph and the outboxes are not fenced in the same
// step: on a Redis Cluster they are in other slots. A holder paused between
// reading the epoch and changing the graph could still change it after a
// newer holder has read it; the lease, which it stops counting on before
// another process can take it, is what keeps that window to a pause.
func (p *Planner) Fence(epoch uint64) { p.epoch.Store(epoch) }

// Checkpoint implements projections.Projector.
func (p *Planner) Checkpoint(ctx context.Context) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.follows() {
		s, err := p.base.Active(ctx)
		if err != nil {
			return 0, err
		}
		p.store = s
	}
	if err := initPlannerPosition(ctx, p.store); err != nil {
		return 0, err
	}
	pos, err := PlannerPosition(ctx, p.store)
	if err != nil {
		return 0, err
	}
	p.applied = pos
	return pos, nil
}

// Verify implements projections.Verifier: while the log is quiet, it notices
// that Redis lost the planner's state (a flush, a failover to an empty replica)
// so that the runner rewinds and replays it.
func (p *Planner) Verify(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.verifyLocked(ctx)
}

// verifyLocked fails with errStateLost unless Redis holds the planner's state
// as of its last batch. Everything that reads that state to plan work checks
// it again afterwards: a flush in between would have let it read a mix of the
// lost state and none, and send that as truth at its position — an inbox the
// replay could then never correct, its sequence guard taking the replayed
// work for old.
//
// It also fails when the keyspace version in use is no longer the planner's: a
// rebuild switched to its own, which the planner resumes in from that
// version's position.
func (p *Planner) verifyLocked(ctx context.Context) error {
	pipe := p.store.Client().Pipeline()
	r := queuePlannerState(ctx, p.store, pipe)
	_, _ = pipe.Exec(ctx) // each command's error is looked at by r.result
	if err := r.fenced(p.epoch.Load()); err != nil {
		return err
	}
	return p.checkState(r.result())
}

// checkState is verifyLocked's judgement of the state read.
func (p *Planner) checkState(pos uint64, exists bool, active int64, err error) error {
	if err != nil {
		return err
	}
	if p.follows() && active != p.store.Version() {
		return fmt.Errorf("keyspace version %d in use, planner at %d: %w", active, p.store.Version(), errStateLost)
	}
	if !exists || pos != p.applied {
		return fmt.Errorf("planner state at %d (stored: %t), expected %d: %w", pos, exists, p.applied, errStateLost)
	}
	return nil
}

// Apply implements projections.Projector. Its effects on the graph and
// outboxes are idempotent and its work is guarded by sequence at the inboxes, so
// a batch applied again after a crash changes nothing twice.
func (p *Planner) Apply(ctx context.Context, batch []events.Record) error {
	lap := p.stopwatch()
	if err := p.apply(ctx, batch, lap); err != nil {
		return err
	}
	p.awaitAppliers(ctx)
	lap("wait")
	return nil
}

// stopwatch returns a function that records, under stage, the time since it
// was last called (or since stopwatch), as the planner's stage metric: where
// a batch's time goes, as the bench reports it.
func (p *Planner) stopwatch() func(stage string) {
	last := time.Now()
	return func(stage string) {
		now := time.Now()
		p.metrics.Staged(PlannerName, stage, now.Sub(last))
		last = now
	}
}

// appliersStall is how long the planner waits for the appliers while they
// apply nothing: they have stopped (a shutdown stops them with the planner,
// whose batch in progress is finished, its context not cancelled), or they
// run elsewhere and are down. The wait paces the planner; it is not what
// keeps the work in order.
const appliersStall = 5 * time.Second

// awaitAppliers waits until at most PendingWork fan-out messages are left
// for the appliers (see PendingWork), without the planner's lock, so that
// warm-ups go on meanwhile. It stops waiting when the appliers have applied
// nothing for the stall time (appliersStall). A failure to look is ignored:
// the batch is applied, and the next one's publish meets the same trouble.
func (p *Planner) awaitAppliers(ctx context.Context) {
	if p.cfg.PendingWork <= 0 {
		return
	}
	if p.fanout == nil {
		s, err := p.js.Stream(ctx, p.cfg.fanout.Stream)
		if err != nil {
			return
		}
		p.fanout = s
	}
	stall := p.stall
	if stall <= 0 {
		stall = appliersStall
	}
	pause := time.Millisecond
	var first, msgs uint64
	var moved time.Time
	for {
		info, err := p.fanout.Info(ctx)
		if err != nil || info.State.Msgs <= uint64(p.cfg.PendingWork) {
			return
		}
		// Progress is work removed: the oldest message gone, or fewer left
		// than at the last look.
		now := time.Now()
		progress := moved.IsZero() || info.State.FirstSeq != first || info.State.Msgs < msgs
		first, msgs = info.State.FirstSeq, info.State.Msgs
		if progress {
			moved = now
		} else if now.Sub(moved) >= stall {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, 16*time.Millisecond)
	}
}

// apply is Apply but for the wait; lap times its stages.
func (p *Planner) apply(ctx context.Context, batch []events.Record, lap func(string)) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	lap("lock")
	// The planner's state and the graph facts of the whole batch in one round
	// trip: every event is new but after a rewind or a crash, when the facts
	// are read again for the events that are.
	pipe := p.store.Client().Pipeline()
	state := queuePlannerState(ctx, p.store, pipe)
	merged := projections.MergeFollows(batch)
	facts := queueFacts(ctx, p.store, pipe, followPairs(merged.Records))
	_, _ = pipe.Exec(ctx) // each command's error is looked at below
	lap("read")
	cp, _, active, err := state.result()
	if err != nil {
		return err
	}
	if err := state.fenced(p.epoch.Load()); err != nil {
		return err
	}
	if p.follows() && active != p.store.Version() {
		return fmt.Errorf("keyspace version %d in use, planner at %d: %w", active, p.store.Version(), errStateLost)
	}
	if cp < p.applied {
		// The position went back: Redis lost the planner's state (a flush, a
		// failover to an empty replica). Rewinding to it replays what is lost.
		// (Not a comparison with the batch's first sequence: the log may
		// legitimately lack the events between.)
		return fmt.Errorf("planner state is at %d, applied %d: %w", cp, p.applied, errStateLost)
	}
	fresh := batch[:0:0]
	for _, rec := range batch {
		if rec.Seq > cp {
			fresh = append(fresh, rec)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	var f *graphFacts
	if len(fresh) == len(batch) {
		f, err = facts.facts(ctx)
	} else {
		merged = projections.MergeFollows(fresh)
		f, err = readGraphFacts(ctx, p.store, followPairs(merged.Records))
	}
	if err != nil {
		return err
	}
	p.metrics.CountMerged(PlannerName, merged.Collapsed, 0)
	if p.beforePlan != nil {
		p.beforePlan()
	}
	w, err := p.planBatch(ctx, merged.Records, f, lap)
	if err != nil {
		return err
	}
	w.occurred = oldestOccurrence(fresh)
	if p.online != nil {
		w.online = p.online.Online()
	}
	lap("plan")
	if err := p.publish(ctx, w, fresh[0].Seq, fresh[len(fresh)-1].Seq); err != nil {
		return err
	}
	lap("publish")
	if err := advancePlannerPosition(ctx, p.store, cp, fresh[len(fresh)-1].Seq, p.epoch.Load(), w.bigChanges); err != nil {
		return err
	}
	lap("position")
	p.applied = fresh[len(fresh)-1].Seq
	return nil
}
