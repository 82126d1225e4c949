package feeds

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
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

// liveFanout is the live planner's; a rebuild has its own (shadowFanout).
var liveFanout = Fanout{Stream: FanoutStream, Subject: "fanout"}

func shadowFanout(v int64) Fanout {
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
	// ItemsPerMessage bounds the work items in one fan-out message (seed 000's
	// feedUpdateBatchSize); default 8 000. Under sync always each message is
	// synced on its own, at publish and again when applied work is removed
	// (a tombstone, synced before the partition's next message is delivered),
	// so fewer larger messages spare the disk and the appliers a wait each; an
	// applier still applies a message in script calls of bounded size
	// (stCallArgs). At 2 000, a batch of the bench's gave a partition one or
	// two messages; at 8 000, one (README, session 25).
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

// Planner is the first stage of the feed projector (seed 000's "prepare the
// list of feeds"). It follows the log in order, is the only writer of the follow
// graph and the outboxes, and turns each event into work for the recipients it
// concerns, in log order, on the recipient's partition. The work is complete in
// itself (a follow carries the followee's outbox as of that point of the log),
// so an applier never reads state another stage is changing, and a recipient's
// work is applied in the order of the log: an unfollow can never be overtaken by
// a push of the same author's post.
type Planner struct {
	// store is base's keyspace version this planner writes, changed only when
	// it resumes (Checkpoint).
	base, store *Store
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
}

// OnMaterialise makes the planner tell f of the users whose inboxes it
// materialises.
func (p *Planner) OnMaterialise(f func(context.Context, []domain.UserID) error) { p.enrolled = f }

// NewPlanner returns the planner writing to store and publishing work with js.
// The live planner writes the keyspace version in use (see Rebuild).
func NewPlanner(store *Store, js jetstream.JetStream, cfg PlannerConfig, metrics *projections.Metrics) *Planner {
	cfg = cfg.withDefaults()
	return &Planner{base: store, store: store.At(max(cfg.version, 1)), js: js, cfg: cfg, metrics: metrics}
}

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
	if err := p.store.initPlannerPosition(ctx); err != nil {
		return 0, err
	}
	pos, err := p.store.PlannerPosition(ctx)
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
	return p.checkState(p.store.plannerState(ctx))
}

// checkState is verifyLocked's judgement of the state read.
func (p *Planner) checkState(pos uint64, exists bool, active int64, err error) error {
	if err != nil {
		return err
	}
	if p.follows() && active != p.store.version {
		return fmt.Errorf("keyspace version %d in use, planner at %d: %w", active, p.store.version, errStateLost)
	}
	if !exists || pos != p.applied {
		return fmt.Errorf("planner state at %d (stored: %t), expected %d: %w", pos, exists, p.applied, errStateLost)
	}
	return nil
}

// Partition is the applier partition of a recipient: the 32-bit FNV-1a hash
// of its decimal id modulo partitions. Persisted: a recipient's work must stay
// in one partition's stream across versions, so never change it.
func Partition(user domain.UserID, partitions int) int {
	// The hash inline over digits on the stack: the planner takes it for every
	// item, and hash/fnv with strconv.FormatInt allocated twice each time.
	var digits [20]byte
	h := uint32(fnvOffset32)
	for _, c := range strconv.AppendInt(digits[:0], int64(user), 10) {
		h ^= uint32(c)
		h *= fnvPrime32
	}
	return int(h % uint32(partitions))
}

// The 32-bit FNV-1a parameters (those of hash/fnv's New32a).
const (
	fnvOffset32 = 2166136261
	fnvPrime32  = 16777619
)

// work collects a batch's items per partition, in order.
type work struct {
	parts [][]Item
	n     int
	// big is the set of big accounts as of the event being planned.
	big map[domain.UserID]bool
	// bigChanges are the accounts whose bigness the batch changed, and to
	// what. They are stored with the batch's position, after its work is
	// published: were they stored with the graph's changes, a batch planned
	// again after a failure in between would find them made, and miss the
	// change (and the merges an account that stops being big owes its
	// followers).
	bigChanges map[domain.UserID]bool
	// occurred is when the oldest event the work comes from occurred (zero:
	// not known), for the appliers' delay metric.
	occurred time.Time
}

func (p *Planner) newWork() *work { return &work{parts: make([][]Item, p.cfg.Partitions)} }

// grow makes room for about n more items spread over the partitions.
func (w *work) grow(n, partitions int) {
	if n < 64 {
		return
	}
	per := n/partitions + n/(4*partitions) // and a quarter, for an uneven spread
	for i := range w.parts {
		w.parts[i] = slices.Grow(w.parts[i], per)
	}
}

func (w *work) add(it Item, partitions int) {
	i := Partition(it.Recipient, partitions)
	w.parts[i] = append(w.parts[i], it)
	w.n++
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
	pipe := p.store.rdb.Pipeline()
	state := p.store.queuePlannerState(ctx, pipe)
	merged := projections.MergeFollows(batch)
	facts := p.store.queueFacts(ctx, pipe, followPairs(merged.Records))
	_, _ = pipe.Exec(ctx) // each command's error is looked at below
	lap("read")
	cp, _, active, err := state.result()
	if err != nil {
		return err
	}
	if p.follows() && active != p.store.version {
		return fmt.Errorf("keyspace version %d in use, planner at %d: %w", active, p.store.version, errStateLost)
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
		f, err = p.store.graphFacts(ctx, followPairs(merged.Records))
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
	lap("plan")
	if err := p.publish(ctx, w, fresh[0].Seq, fresh[len(fresh)-1].Seq); err != nil {
		return err
	}
	lap("publish")
	if err := p.store.advancePlannerPosition(ctx, cp, fresh[len(fresh)-1].Seq, w.bigChanges); err != nil {
		return err
	}
	lap("position")
	p.applied = fresh[len(fresh)-1].Seq
	return nil
}

// planBatch applies a batch's changes to the graph and the outboxes and
// plans its work, with facts read beforehand and one round trip however many
// follows it holds. The facts decide how each follow is planned (graphFacts,
// read in Apply's first round trip with the planner's state), so that the
// follower count after every follow, and with it every change of an account's
// bigness, is known before anything is written; the round trip makes the
// changes in log order with the reads that planning needs among them
// (graphChanges). When each follow was a round trip of its own, a batch of
// 2 000 events with 85 follows took 2.5 s under load, every round trip
// waiting for the appliers' scripts.
//
// lap times its round trip ("changes", with what came before it since the
// first round trip) apart from the work's making ("plan").
func (p *Planner) planBatch(ctx context.Context, recs []events.Record, facts *graphFacts, lap func(string)) (*work, error) {
	w := p.newWork()
	w.big = facts.big
	g := p.store.newGraphChanges(ctx)
	// Each run of events between follows, and each follow, leaves how to add
	// its work once the reads are back.
	var plans []func(*work) error
	for len(recs) > 0 {
		n := 0
		for n < len(recs) && !isFollowEvent(recs[n]) {
			n++
		}
		if n > 0 {
			plans = append(plans, p.queuePosts(g, recs[:n], w.big))
			recs = recs[n:]
			continue
		}
		plans = append(plans, p.queueFollow(g, recs[0], facts))
		recs = recs[1:]
	}
	// The state is read again after every read planning uses, in the same
	// round trip (see verifyLocked): Redis runs a pipeline in order, so a flush
	// before any of those reads shows here.
	state := p.store.queuePlannerState(ctx, g.pipe)
	if err := g.exec(); err != nil {
		return nil, err
	}
	lap("changes")
	if err := p.checkState(state.result()); err != nil {
		return nil, err
	}
	for _, plan := range plans {
		if err := plan(w); err != nil {
			return nil, err
		}
	}
	w.bigChanges = facts.changed
	return w, nil
}

// followPairs are the pairs of the follow and unfollow events of recs.
func followPairs(recs []events.Record) []projections.FollowPair {
	var pairs []projections.FollowPair
	for _, rec := range recs {
		if pr, _, ok := followOf(rec); ok {
			pairs = append(pairs, pr)
		}
	}
	return pairs
}

func isFollowEvent(rec events.Record) bool {
	_, _, ok := followOf(rec)
	return ok
}

// followOf is the pair of a follow or unfollow event, and which it is.
func followOf(rec events.Record) (pr projections.FollowPair, follow, ok bool) {
	switch e := rec.Event.(type) {
	case events.UserFollowed:
		return projections.FollowPair{Follower: e.FollowerID, Followee: e.FolloweeID}, true, true
	case events.UserUnfollowed:
		return projections.FollowPair{Follower: e.FollowerID, Followee: e.FolloweeID}, false, true
	}
	return projections.FollowPair{}, false, false
}

// queuePosts queues the outbox changes of a run of events without follows
// and the reads of the followers its work goes to, and returns how to add
// that work: a new post is pushed to its author's followers (not a big
// account's: those are merged in at read time), a deleted one removed from
// them (also a big account's: followers may hold copies pushed before).
// Edits, likes and comments change no feed: pages are hydrated from the read
// model. big is the big accounts as of the run.
func (p *Planner) queuePosts(g *graphChanges, recs []events.Record, big map[domain.UserID]bool) func(*work) error {
	pushed := make([]bool, len(recs))
	reads := map[domain.UserID]usersRead{}
	var authors []domain.UserID
	need := func(a domain.UserID) {
		if _, ok := reads[a]; !ok {
			reads[a] = usersRead{}
			authors = append(authors, a)
		}
	}
	for i, rec := range recs {
		switch e := rec.Event.(type) {
		case events.PostCreated:
			g.changeOutbox(OutboxChange{Author: e.UserID, Post: e.PostID})
			if !big[e.UserID] {
				pushed[i] = true
				need(e.UserID)
			}
		case events.PostDeleted:
			g.changeOutbox(OutboxChange{Author: e.UserID, Post: e.PostID, Remove: true})
			need(e.UserID)
		}
	}
	// Read after the run's changes, which do not alter followers.
	for _, a := range authors {
		reads[a] = g.followers(a)
	}
	return func(w *work) error {
		followers := make(map[domain.UserID][]domain.UserID, len(authors))
		for _, a := range authors {
			users, err := reads[a].users()
			if err != nil {
				return err
			}
			followers[a] = users
		}
		// The items are most of a batch's work: room for them at once rather
		// than slices doubled again and again as they are added.
		n := 0
		for i, rec := range recs {
			if e, ok := rec.Event.(events.PostCreated); ok && pushed[i] {
				n += len(followers[e.UserID])
			}
		}
		w.grow(n, p.cfg.Partitions)
		for i, rec := range recs {
			var (
				author domain.UserID
				it     = Item{Seq: rec.Seq}
			)
			switch e := rec.Event.(type) {
			case events.PostCreated:
				if !pushed[i] {
					continue
				}
				author, it.Op, it.Posts = e.UserID, OpPush, []domain.PostID{e.PostID}
			case events.PostDeleted:
				author, it.Op, it.Posts = e.UserID, OpRemove, []domain.PostID{e.PostID}
			default:
				continue
			}
			for _, f := range followers[author] {
				it.Recipient = f
				w.add(it, p.cfg.Partitions)
			}
		}
		return nil
	}
}

// errGraphMoved is a follower count that is not the one planned: the graph
// changed between the reads of a batch's facts and its changes.
var errGraphMoved = errors.New("the follow graph changed while a batch was planned")

// queueFollow queues a follow or unfollow and the reads its work needs, and
// returns how to add that work: the follower gets the followee's outbox to
// merge or unmerge (none to merge from a big account: its posts are merged at
// read time). It also keeps the set of big accounts, whose posts are not
// pushed: an account that stops being big gets its outbox merged into every
// follower's inbox, since its posts of the big period were never pushed.
func (p *Planner) queueFollow(g *graphChanges, rec events.Record, facts *graphFacts) func(*work) error {
	pr, follow, _ := followOf(rec)
	op := OpUnmerge
	if follow {
		op = OpMerge
	}
	n := facts.follow(pr, follow)
	read := g.changeFollow(pr, follow)
	big := p.store.Config().isBig(n, facts.big[pr.Followee])
	var all *usersRead
	if big != facts.big[pr.Followee] {
		facts.big[pr.Followee] = big
		facts.changed[pr.Followee] = big
		if !big {
			r := g.followers(pr.Followee)
			all = &r
		}
	}
	return func(w *work) error {
		count, out, err := read.result()
		if err != nil {
			return err
		}
		if count != n {
			return fmt.Errorf("user %d has %d followers after event %d, planned for %d: %w", pr.Followee, count, rec.Seq, n, errGraphMoved)
		}
		if all != nil {
			followers, err := all.users()
			if err != nil {
				return err
			}
			for _, f := range followers {
				w.add(Item{Recipient: f, Seq: rec.Seq, Op: OpMerge, Posts: out.Posts, Floor: out.Floor}, p.cfg.Partitions)
			}
		}
		if follow && big {
			return nil
		}
		w.add(Item{Recipient: pr.Follower, Seq: rec.Seq, Op: op, Posts: out.Posts, Floor: out.Floor}, p.cfg.Partitions)
		return nil
	}
}

// bigSet is the set of big accounts.
func (p *Planner) bigSet(ctx context.Context) (map[domain.UserID]bool, error) {
	list, err := p.store.BigAccounts(ctx)
	if err != nil {
		return nil, err
	}
	big := make(map[domain.UserID]bool, len(list))
	for _, b := range list {
		big[b] = true
	}
	return big, nil
}

// Materialise builds the inboxes readers asked for (cold start): each from the
// outboxes of the user's followees, except big accounts, as of the planner's
// position, and sent in order with the user's other work, so that no push,
// unfollow or delete can be lost or undone by it.
func (p *Planner) Materialise(ctx context.Context, max int) (int, error) {
	// Most calls find no request: they look without holding the lock, which
	// the planner's batches wait for. Under the bench's load the calls (a
	// loop polls every 20 ms) held it for two round trips to Redis each, and
	// the batches waited longer for them than they took.
	p.mu.Lock()
	store := p.store
	p.mu.Unlock()
	if n, err := store.rdb.LLen(ctx, store.key(stWarmKey)).Result(); err != nil || n == 0 {
		return 0, nil // Redis unreachable: the runner finds it out, and requests wait
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// Never build an inbox from state that is not the log's up to a position:
	// after a loss, wait for the replay to begin.
	if err := p.verifyLocked(ctx); err != nil {
		return 0, nil // the runner rewinds; requests wait for the replay
	}
	users, err := p.store.PopMaterialiseRequests(ctx, max)
	if err != nil || len(users) == 0 {
		return 0, err
	}
	if err := p.store.clearWarming(ctx, users); err != nil {
		return 0, err
	}
	cp := p.applied
	big, err := p.bigSet(ctx)
	if err != nil {
		return 0, err
	}
	w := p.newWork()
	for _, u := range users {
		it, err := p.expectedInbox(ctx, u, big)
		if err != nil {
			return 0, err
		}
		it.Seq, it.Op, it.Allowed = cp, OpMaterialise, nil
		w.add(it, p.cfg.Partitions)
	}
	if err := p.verifyLocked(ctx); err != nil {
		// Lost while reading: the requests went with it, and readers ask again.
		return 0, nil
	}
	if err := p.publish(ctx, w, cp, cp); err != nil {
		return 0, err
	}
	if p.enrolled != nil {
		if err := p.enrolled(ctx, users); err != nil {
			return len(users), err
		}
	}
	return len(users), nil
}

// Reconcile sends each user's inbox, as the planner's graph and outboxes say it
// must be at the planner's position, to be compared with and made equal to the
// inbox (in order with the user's other work, like materialise); the appliers
// count what they had to repair.
func (p *Planner) Reconcile(ctx context.Context, users []domain.UserID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(users) == 0 {
		return nil
	}
	if err := p.verifyLocked(ctx); err != nil {
		return nil // state lost: the runner replays; check later
	}
	big, err := p.bigSet(ctx)
	if err != nil {
		return err
	}
	w := p.newWork()
	for _, u := range users {
		it, err := p.expectedInbox(ctx, u, big)
		if err != nil {
			return err
		}
		it.Seq, it.Op = p.applied, OpReconcile
		w.add(it, p.cfg.Partitions)
	}
	if err := p.verifyLocked(ctx); err != nil {
		return nil
	}
	return p.publish(ctx, w, p.applied, p.applied)
}

// expectedInbox is user's inbox from the outboxes of the accounts they follow
// that are not big (Posts, Floor: no lower than any followed big account's
// outbox floor), and the posts of the big ones (Allowed).
func (p *Planner) expectedInbox(ctx context.Context, user domain.UserID, big map[domain.UserID]bool) (Item, error) {
	followees, err := p.store.Following(ctx, user)
	if err != nil {
		return Item{}, err
	}
	outs, err := p.store.Outboxes(ctx, followees)
	if err != nil {
		return Item{}, err
	}
	small := map[domain.UserID]Outbox{}
	var (
		allowed  []domain.PostID
		bigFloor int64
	)
	for f, o := range outs {
		if big[f] {
			allowed = append(allowed, o.Posts...)
			bigFloor = max(bigFloor, o.Floor)
			continue
		}
		small[f] = o
	}
	posts, floor := mergeOutboxes(small, p.store.Config().InboxCap)
	// Reads take nothing from the cache below a big followee's outbox floor (see
	// Store.Page), and posts a big account had pushed before it grew big may lie
	// there, which nothing can vouch for: the inbox starts above them.
	if bigFloor > floor {
		floor = bigFloor
		kept := posts[:0]
		for _, id := range posts {
			if int64(id) >= floor {
				kept = append(kept, id)
			}
		}
		posts = kept
	}
	return Item{Recipient: user, Posts: posts, Floor: floor, Allowed: allowed}, nil
}

// mergeOutboxes is the newest limit posts of the outboxes and how far down they
// are complete: no lower than any outbox's own floor, nor than the last post
// kept when there were more.
func mergeOutboxes(outs map[domain.UserID]Outbox, limit int) ([]domain.PostID, int64) {
	var all []domain.PostID
	var floor int64
	for _, o := range outs {
		all = append(all, o.Posts...)
		floor = max(floor, o.Floor)
	}
	sortDesc(all)
	kept := all[:0]
	for _, id := range all {
		if int64(id) >= floor {
			kept = append(kept, id)
		}
	}
	if len(kept) > limit {
		kept = kept[:limit]
		floor = int64(kept[len(kept)-1])
	}
	return kept, floor
}

func sortDesc(ids []domain.PostID) {
	slices.SortFunc(ids, func(a, b domain.PostID) int { return cmp.Compare(b, a) })
}

// publish sends the work, chunked, to each partition's subject and waits for
// the log to store it.
func (p *Planner) publish(ctx context.Context, w *work, first, last uint64) error {
	if w.n == 0 {
		return nil
	}
	var acks []jetstream.PubAckFuture
	// The body's share of the server's largest payload: headers take a few
	// dozen bytes.
	limit := int(p.js.Conn().MaxPayload()) - 1024
	var groups recipientGroups
	for part, items := range w.parts {
		// Each recipient's items together, in their order: a message then
		// holds long runs of one recipient's pushes, which an applier puts
		// into the inbox at once (see apply.lua), and which the body encodes
		// with the recipient once (see encodeWork), rather than a post's
		// followers one after another.
		items = groups.arrange(items)
		for len(items) > 0 {
			n := min(len(items), p.cfg.ItemsPerMessage)
			data, err := encodeWork(items[:n])
			if err != nil {
				return err
			}
			// Items differ in size (a follow's carries up to an outbox of
			// posts), and the server refuses a message over its largest
			// payload: that batch would fail for ever. Fewer items, in
			// proportion, until the message fits.
			for len(data) > limit && n > 1 {
				n = max(1, min(n-1, n*limit/len(data)*9/10))
				if data, err = encodeWork(items[:n]); err != nil {
					return err
				}
			}
			// No dedup id: work published again after a rewind must be delivered
			// (an inbox built meanwhile needs it), and the inboxes' sequence guard
			// makes a second delivery change nothing.
			msg := nats.NewMsg(fmt.Sprintf("%s.%d", p.cfg.fanout.Subject, part))
			msg.Data = data
			msg.Header.Set(versionHeader, strconv.FormatInt(p.store.version, 10))
			// The first log sequence the work comes from: the feeds' position is
			// just below the oldest work not yet applied.
			msg.Header.Set(fromHeader, strconv.FormatUint(first, 10))
			if !w.occurred.IsZero() {
				msg.Header.Set(occurredHeader, strconv.FormatInt(w.occurred.UnixMilli(), 10))
			}
			ack, err := p.js.PublishMsgAsync(msg)
			if err != nil {
				return fmt.Errorf("publish work: %w", err)
			}
			acks = append(acks, ack)
			if len(acks) == publishWindow {
				if err := awaitAcks(ctx, acks); err != nil {
					return err
				}
				acks = acks[:0]
			}
			items = items[n:]
		}
	}
	return awaitAcks(ctx, acks)
}

// publishWindow bounds the planner's messages awaiting their acks. The
// JetStream context's publishers share a bound of their own (4 000 by
// default), and a publish that waits for room longer than a fifth of a
// second fails: a batch cut into thousands of messages (the planner tests'
// five items a message) failed that way under load, and filled the room the
// API's commands publish in.
const publishWindow = 256

// awaitAcks waits for the server's acks of published work.
func awaitAcks(ctx context.Context, acks []jetstream.PubAckFuture) error {
	for _, a := range acks {
		select {
		case <-a.Ok():
		case err := <-a.Err():
			return fmt.Errorf("publish work: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// oldestOccurrence is when the earliest of recs occurred (zero if none says).
func oldestOccurrence(recs []events.Record) time.Time {
	var t time.Time
	for _, rec := range recs {
		if !rec.OccurredAt.IsZero() && (t.IsZero() || rec.OccurredAt.Before(t)) {
			t = rec.OccurredAt
		}
	}
	return t
}

// recipientGroups puts each recipient's items together, in their order, the
// recipients in the order they first appear. It is a counting sort in two
// passes over the items, where a stable sort by recipient took some
// n·log n comparisons and moves of 64-byte items on the planner's serial
// path. Its buffers serve one partition after another.
type recipientGroups struct {
	index map[domain.UserID]int
	// group is each item's group; next, each group's next place in out.
	group []int
	next  []int
	out   []Item
}

// arrange returns items grouped by recipient: items itself if they already
// are (a materialisation's, one each), else a slice of g's that is valid
// until its next call.
func (g *recipientGroups) arrange(items []Item) []Item {
	if g.index == nil {
		g.index = make(map[domain.UserID]int)
	}
	clear(g.index)
	g.group, g.next = g.group[:0], g.next[:0]
	runs := 0
	for i, it := range items {
		if i == 0 || it.Recipient != items[i-1].Recipient {
			runs++
		}
		k, ok := g.index[it.Recipient]
		if !ok {
			k = len(g.next)
			g.index[it.Recipient] = k
			g.next = append(g.next, 0)
		}
		g.group = append(g.group, k)
		g.next[k]++
	}
	if runs == len(g.next) {
		return items
	}
	at := 0
	for k, n := range g.next {
		g.next[k] = at
		at += n
	}
	g.out = slices.Grow(g.out[:0], len(items))[:len(items)]
	for i, it := range items {
		k := g.group[i]
		g.out[g.next[k]] = it
		g.next[k]++
	}
	return g.out
}
