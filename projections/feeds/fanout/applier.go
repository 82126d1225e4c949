package fanout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

// fromHeader carries, on each fan-out message, the first log sequence its work
// comes from.
const fromHeader = "Feed-From-Seq"

// occurredHeader carries, on each fan-out message, when the oldest event whose
// work it carries occurred (Unix milliseconds), for the delay metric.
const occurredHeader = "Feed-Occurred"

// onlineHeader marks a fan-out message whose work is for online recipients
// (holding a live stream), published ahead of the others' (see Online).
const onlineHeader = "Feed-Online"

// AppliersName names the appliers in metrics and checks.
const AppliersName = "feeds-appliers"

// Applier is the second stage of the feed projector: it applies the planner's work to the inboxes of some partitions. One
// goroutine per partition takes one message at a time, so each recipient's work
// is applied in log order; inbox scripts skip work at or below the inbox's
// sequence, so redelivered work changes nothing.
type Applier struct {
	store      *feeds.Store
	js         jetstream.JetStream
	partitions []int
	logger     *slog.Logger
	metrics    *projections.Metrics
	running    atomic.Int32
	applied    atomic.Int64

	// fanout is the stream it consumes; pinned, a rebuild's keyspace version,
	// the only one its appliers apply.
	fanout Fanout
	pinned int64
	// floor is the oldest keyspace version whose work is still applied (work
	// for one a rebuild replaced is dropped), as of checked (unix nanoseconds).
	floor   atomic.Int64
	checked atomic.Int64
	// beforeApply, when set (by tests), runs before each message's work is
	// applied; an error fails the message as Redis would.
	beforeApply func([]inbox.Item) error
}

// NewApplier returns an applier of the given partitions. It applies work to
// the keyspace version the work was planned for, unless a newer one is in use.
// Its delays go to metrics (which may be nil).
func NewApplier(store *feeds.Store, js jetstream.JetStream, partitions []int, metrics *projections.Metrics, logger *slog.Logger) *Applier {
	return &Applier{store: store, js: js, partitions: partitions, metrics: metrics, fanout: liveFanout, logger: logger.With("projector", "feeds-applier")}
}

// NewShadowApplier returns the appliers of a rebuild's planner p (see
// NewShadowPlanner): every partition of its stream, applied to its keyspace
// version alone.
func NewShadowApplier(store *feeds.Store, js jetstream.JetStream, p *Planner, logger *slog.Logger) *Applier {
	parts := make([]int, p.cfg.Partitions)
	for i := range parts {
		parts[i] = i
	}
	a := NewApplier(store, js, parts, nil, logger)
	a.fanout, a.pinned = p.cfg.fanout, p.cfg.version
	return a
}

// storeFor returns the store to apply work for keyspace version v, or false if
// that version was replaced.
func (a *Applier) storeFor(ctx context.Context, v int64) (*feeds.Store, bool) {
	if a.pinned != 0 {
		return a.store.At(a.pinned), v == a.pinned
	}
	now, last := time.Now().UnixNano(), a.checked.Load()
	if now-last >= int64(feeds.VersionCheck) && a.checked.CompareAndSwap(last, now) {
		if active, err := a.store.ActiveVersion(ctx); err == nil {
			raise(&a.floor, active)
		}
	}
	if v < a.floor.Load() {
		return nil, false
	}
	// Work for a newer version means the switch happened: the older is gone.
	raise(&a.floor, v)
	return a.store.At(v), true
}

func raise(n *atomic.Int64, v int64) {
	for {
		cur := n.Load()
		if v <= cur || n.CompareAndSwap(cur, v) {
			return
		}
	}
}

// workVersion is the keyspace version of a fan-out message's work.
func workVersion(msg jetstream.Msg) (int64, error) {
	h := msg.Headers().Get(versionHeader)
	if h == "" {
		return 1, nil
	}
	v, err := strconv.ParseInt(h, 10, 64)
	if err != nil || v < 1 {
		return 0, fmt.Errorf("work with %s %q", versionHeader, h)
	}
	return v, nil
}

// Running reports whether every partition is consuming.
func (a *Applier) Running() bool { return int(a.running.Load()) == len(a.partitions) }

// Consuming is how many partitions are consuming.
func (a *Applier) Consuming() int { return int(a.running.Load()) }

// Applied counts the inbox changes made (work items not skipped).
func (a *Applier) Applied() int64 { return a.applied.Load() }

// Run applies work until ctx ends.
func (a *Applier) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, p := range a.partitions {
		g.Go(func() error { return a.runPartition(ctx, p) })
	}
	return g.Wait()
}

// RunPartition applies the work of partition part until ctx ends: Run's
// work for one partition, for a process that holds a share of them (see
// lease.Leases.Share; its partitions, as NewApplier's, may be none). When ctx
// ends it finishes the message in hand; the work delivered after it and not
// applied goes, in order, to the next consumer of the partition.
func (a *Applier) RunPartition(ctx context.Context, part int) error { return a.runPartition(ctx, part) }

func (a *Applier) runPartition(ctx context.Context, part int) error {
	const firstBackoff = 50 * time.Millisecond
	backoff := firstBackoff
	for ctx.Err() == nil {
		err := a.consume(ctx, part)
		if err == nil || ctx.Err() != nil {
			// Stopping: the error, if any, is the shutdown's own.
			return nil //nolint:nilerr // an error caused by shutdown is not a failure
		}
		if errors.Is(err, projections.ErrGap) {
			// Work lost on the way: the server is there, so read again at once.
			backoff = firstBackoff
		}
		a.metrics.Rewound(AppliersName, projections.RewindCause(err))
		a.logger.Warn("applier retries", "partition", part, "err", err, "after", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil
		}
		backoff = min(backoff*2, 5*time.Second)
	}
	return nil
}

// workAhead is how many fan-out messages an applier's consumer delivers
// before the first of them is acknowledged: the next message comes while one
// is applied, instead of after its acknowledgement, which the server takes
// with a synced removal under sync always. Messages are still applied one at
// a time, in order (see consume).
const workAhead = 2

func (a *Applier) consume(ctx context.Context, part int) error {
	durable := fmt.Sprintf("feeds-applier-%d", part)
	if a.pinned != 0 {
		durable = fmt.Sprintf("feeds-applier-v%d-%d", a.pinned, part)
	}
	// Each start takes a consumer of its own: one created afresh on the work
	// queue delivers from the oldest work the stream still holds, in order,
	// whatever an earlier one had delivered ahead. So when a message fails,
	// the later ones delivered behind it are never applied before it: the
	// loop stops at the failure and the next start delivers it first again.
	// (Redeliveries within one consumer are of work applied already, or being
	// applied: the loop applies what it receives in order, and the inboxes'
	// sequences make a second application change nothing.)
	if err := a.js.DeleteConsumer(ctx, a.fanout.Stream, durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("applier consumer %d: %w", part, err)
	}
	cons, err := a.js.CreateConsumer(ctx, a.fanout.Stream, jetstream.ConsumerConfig{
		Durable:       durable,
		Description:   "Applies the feed planner's work for one partition of recipients, in order.",
		FilterSubject: fmt.Sprintf("%s.%d", a.fanout.Subject, part),
		AckPolicy:     jetstream.AckExplicitPolicy,
		MaxAckPending: workAhead,
		AckWait:       time.Minute,
	})
	if err != nil {
		return fmt.Errorf("applier consumer %d: %w", part, err)
	}
	msgs, err := cons.Messages(jetstream.PullMaxMessages(workAhead))
	if err != nil {
		return fmt.Errorf("applier consumer %d: %w", part, err)
	}
	defer msgs.Stop()
	defer context.AfterFunc(ctx, msgs.Stop)()
	w := &lostWork{cons: cons, stop: msgs.Stop}
	watchCtx, stopWatching := context.WithCancel(ctx)
	var watching sync.WaitGroup
	watching.Go(func() { w.watch(watchCtx) })
	defer watching.Wait()
	defer stopWatching()
	a.running.Add(1)
	defer a.running.Add(-1)
	round := func(d time.Duration) { a.metrics.Staged(AppliersName, "round", d) }
	// delivered counts the consumer's deliveries: each must be the next, or
	// one was lost on the way (with a connection or a node) and the work after
	// it would overtake it; the next start delivers the oldest work again.
	var delivered uint64
	for ctx.Err() == nil {
		asked := time.Now()
		w.touch()
		w.holding.Store(false)
		msg, err := msgs.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if w.found.Load() {
				return fmt.Errorf("%w: work for this applier, or its request for work, was lost on the way", projections.ErrGap)
			}
			return fmt.Errorf("fetch work: %w", err)
		}
		w.holding.Store(true)
		got := time.Now()
		a.metrics.Staged(AppliersName, "fetch", got.Sub(asked))
		meta, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("work metadata: %w", err)
		}
		if meta.Sequence.Consumer != delivered+1 {
			return fmt.Errorf("%w: work delivery %d came where %d was expected", projections.ErrGap, meta.Sequence.Consumer, delivered+1)
		}
		delivered++
		var items []inbox.Item
		v, err := workVersion(msg)
		if err == nil {
			items, err = decodeWork(msg.Data())
		}
		if err != nil {
			// Work is written by the planner of this build; a body that does
			// not decode can never be applied, so it is logged and dropped.
			a.logger.Error("undecodable work dropped", "partition", part, "err", err)
			_ = msg.Term()
			continue
		}
		store, ok := a.storeFor(ctx, v)
		if !ok {
			_ = msg.Ack() // for a keyspace version a rebuild replaced
			continue
		}
		if a.beforeApply != nil {
			if err := a.beforeApply(items); err != nil {
				return fmt.Errorf("apply work: %w", err)
			}
		}
		n, err := inbox.ApplyTimed(context.WithoutCancel(ctx), store, items, round)
		if err != nil {
			// Not acknowledged: the next start delivers it before anything later.
			return fmt.Errorf("apply work: %w", err)
		}
		a.metrics.Staged(AppliersName, "apply", time.Since(got))
		a.applied.Add(int64(n))
		if ms, err := strconv.ParseInt(msg.Headers().Get(occurredHeader), 10, 64); err == nil {
			a.metrics.Delayed(AppliersName, time.UnixMilli(ms))
			a.metrics.Fresh(msg.Headers().Get(onlineHeader) != "", time.UnixMilli(ms))
		}
		// Acknowledged without waiting for the server's answer: the order
		// holds without it (see above), and an acknowledgement lost on the
		// way brings the message again, which the inboxes' sequences make a
		// no-op. Waiting for the answer (a synced removal under sync always)
		// took 14–32 ms of every message in a partition's serial loop at the
		// bench's rates.
		if err := msg.Ack(); err != nil {
			return fmt.Errorf("ack work: %w", err)
		}
	}
	return nil
}

// lostWork notices work, or the applier's request for it, lost on the way
// (sent to a connection or through a node that was lost). Work delivered and
// lost is pending acknowledgement, and with workAhead of it pending the
// server delivers nothing more until its ack wait ends, a minute later; a
// lost request leaves the client waiting for work the server never sends
// until the request expires. An applier that holds no work and has heard
// nothing for lostAfter while its consumer has work, delivered or not, is
// stopped, and its next start delivers that work.
type lostWork struct {
	cons jetstream.Consumer
	stop func()
	// last is when the applier last began to wait for work (unix nanos).
	last    atomic.Int64
	holding atomic.Bool
	found   atomic.Bool
}

// lostAfter is how long an idle applier waits before it asks whether work
// was lost on the way: longer than an acknowledgement takes to arrive.
const lostAfter = 2 * time.Second

func (w *lostWork) touch() { w.last.Store(time.Now().UnixNano()) }

func (w *lostWork) watch(ctx context.Context) {
	tick := time.NewTicker(lostAfter / 2)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if w.holding.Load() || time.Since(time.Unix(0, w.last.Load())) < lostAfter {
			continue
		}
		info, err := w.cons.Info(ctx)
		if err != nil || info.NumAckPending == 0 && info.NumPending == 0 {
			continue // a consumer that cannot be asked fails the fetch itself
		}
		w.found.Store(true)
		w.stop()
		return
	}
}
