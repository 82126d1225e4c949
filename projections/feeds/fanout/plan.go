package fanout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

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
	parts [][]inbox.Item
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
	// online are the recipients whose work is published first.
	online map[domain.UserID]struct{}
}

func (p *Planner) newWork() *work { return &work{parts: make([][]inbox.Item, p.cfg.Partitions)} }

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

func (w *work) add(it inbox.Item, partitions int) {
	i := Partition(it.Recipient, partitions)
	w.parts[i] = append(w.parts[i], it)
	w.n++
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
	g := newGraphChanges(ctx, p.store)
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
	state := queuePlannerState(ctx, p.store, g.pipe)
	if err := g.exec(); err != nil {
		return nil, err
	}
	lap("changes")
	if err := state.fenced(p.epoch.Load()); err != nil {
		return nil, err
	}
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
			g.changeOutbox(feeds.OutboxChange{Author: e.UserID, Post: e.PostID})
			if !big[e.UserID] {
				pushed[i] = true
				need(e.UserID)
			}
		case events.PostDeleted:
			g.changeOutbox(feeds.OutboxChange{Author: e.UserID, Post: e.PostID, Remove: true})
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
				it     = inbox.Item{Seq: rec.Seq}
			)
			switch e := rec.Event.(type) {
			case events.PostCreated:
				if !pushed[i] {
					continue
				}
				author, it.Op, it.Posts = e.UserID, inbox.OpPush, []domain.PostID{e.PostID}
			case events.PostDeleted:
				author, it.Op, it.Posts = e.UserID, inbox.OpRemove, []domain.PostID{e.PostID}
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
	op := inbox.OpUnmerge
	if follow {
		op = inbox.OpMerge
	}
	n := facts.follow(pr, follow)
	read := g.changeFollow(pr, follow)
	big := p.store.Config().IsBig(n, facts.big[pr.Followee])
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
				w.add(inbox.Item{Recipient: f, Seq: rec.Seq, Op: inbox.OpMerge, Posts: out.Posts, Floor: out.Floor}, p.cfg.Partitions)
			}
		}
		if follow && big {
			return nil
		}
		w.add(inbox.Item{Recipient: pr.Follower, Seq: rec.Seq, Op: op, Posts: out.Posts, Floor: out.Floor}, p.cfg.Partitions)
		return nil
	}
}
