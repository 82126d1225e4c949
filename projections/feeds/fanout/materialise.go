package fanout

import (
	"cmp"
	"context"
	"slices"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

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
	if n, err := store.PendingMaterialise(ctx); err != nil || n == 0 {
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
	if err := p.store.ClearWarming(ctx, users); err != nil {
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
		it.Seq, it.Op, it.Allowed = cp, inbox.OpMaterialise, nil
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
		it.Seq, it.Op = p.applied, inbox.OpReconcile
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
func (p *Planner) expectedInbox(ctx context.Context, user domain.UserID, big map[domain.UserID]bool) (inbox.Item, error) {
	followees, err := p.store.Following(ctx, user)
	if err != nil {
		return inbox.Item{}, err
	}
	outs, err := p.store.Outboxes(ctx, followees)
	if err != nil {
		return inbox.Item{}, err
	}
	small := map[domain.UserID]feeds.Outbox{}
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
	// inbox.ReadPage), and posts a big account had pushed before it grew big may lie
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
	return inbox.Item{Recipient: user, Posts: posts, Floor: floor, Allowed: allowed}, nil
}

// mergeOutboxes is the newest limit posts of the outboxes and how far down they
// are complete: no lower than any outbox's own floor, nor than the last post
// kept when there were more.
func mergeOutboxes(outs map[domain.UserID]feeds.Outbox, limit int) ([]domain.PostID, int64) {
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
