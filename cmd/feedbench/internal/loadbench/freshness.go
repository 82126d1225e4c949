package loadbench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/feedproject/feed/domain"
)

// pollSchedule is how often the freshness poller reads a follower's feed,
// by the time since the post's 202: every step's interval until its end,
// then the next step's. The resolution is finest where the targets are (250
// ms for ordinary authors, 2 s for big ones) and coarse past them, so that
// the poller stays a small part of the reads however late the feeds are: its
// reads grow with the feeds' lateness, and they slow the feeds down (the
// measurements are in decision 55).
var pollSchedule = []struct{ until, every time.Duration }{
	{300 * time.Millisecond, 20 * time.Millisecond},
	{500 * time.Millisecond, 50 * time.Millisecond},
	{2500 * time.Millisecond, 250 * time.Millisecond},
	{0, time.Second}, // until the timeout
}

// pollWait is how long the poller waits before its next read of a post
// whose 202 came elapsed ago.
func pollWait(elapsed time.Duration) time.Duration {
	for _, st := range pollSchedule {
		if st.until == 0 || elapsed < st.until {
			return st.every
		}
	}
	return pollSchedule[len(pollSchedule)-1].every
}

// pollScheduleText describes pollSchedule for the report.
func pollScheduleText() string {
	parts := make([]string, len(pollSchedule))
	for i, st := range pollSchedule {
		if st.until == 0 {
			parts[i] = "then every " + fmtDuration(st.every)
		} else {
			parts[i] = fmt.Sprintf("every %s to %s", fmtDuration(st.every), fmtDuration(st.until))
		}
	}
	return strings.Join(parts, ", ")
}

// freshBudget lets at most rate posts per second of each class (ordinary and
// big authors) have their freshness measured, so that the poller stays a small
// part of the load; big authors' posts are rare, so they have a budget of their
// own.
type freshBudget struct {
	interval time.Duration
	last     [2]time.Time
}

func newFreshBudget(rate float64) *freshBudget {
	return &freshBudget{interval: time.Duration(float64(time.Second) / rate)}
}

// take reports whether a post intended at t is sampled.
func (b *freshBudget) take(big bool, t time.Time) bool {
	i := 0
	if big {
		i = 1
	}
	if !b.last[i].IsZero() && t.Sub(b.last[i]) < b.interval {
		return false
	}
	b.last[i] = t
	return true
}

// unseenLogged is how many posts never seen by their poller a run names.
const unseenLogged = 20

// trackFreshness polls each of pollers' home feeds until post is in it, and
// records the time from acceptedAt (the 202) to the answer that showed it. At
// most cap(r.fresh) pollers run at once; a post that finds them all busy is
// not sampled.
func (r *runner) trackFreshness(ctx context.Context, p *phase, author domain.UserID, post domain.PostID, pos uint64, big bool, acceptedAt time.Time, pollers []domain.UserID) {
	for _, u := range pollers {
		select {
		case r.fresh <- struct{}{}:
		default:
			continue
		}
		r.tasks.Go(func() {
			defer func() { <-r.fresh }()
			d, seen := r.pollUntilSeen(ctx, p, u, post, acceptedAt)
			if ctx.Err() != nil {
				return
			}
			p.fresh.add(big, d, seen)
			// Named, so that a post that never arrived can be looked for in
			// the log and the stores (with --keep).
			if !seen && r.unseen.Add(1) <= unseenLogged {
				r.logf("freshness: post %d of user %d (accepted %s at position %d) was not on follower %d's feed within %s; %s",
					post, author, acceptedAt.UTC().Format(time.RFC3339Nano), pos, u, fmtDuration(r.cfg.FreshTimeout),
					r.lateOrLost(ctx, u, post, pos))
			}
		})
	}
}

// lateOrLost says whether a post its poller never saw is on the follower's
// feed once the feeds have applied the post's position (X-Min-Position): a
// post that is there was late; one that is not was lost, which no correct
// run has. Its reads are not recorded in the phase.
func (r *runner) lateOrLost(ctx context.Context, user domain.UserID, post domain.PostID, pos uint64) string {
	page, at, err := r.api.feed(ctx, user, aboveCursor(post), pos)
	switch {
	case err != nil:
		return fmt.Sprintf("its page once the feeds reach its position: %v", err)
	case at < pos:
		return fmt.Sprintf("the feeds had not reached its position (they were at %d)", at)
	case len(page.IDs) > 0 && page.IDs[0] == post:
		return fmt.Sprintf("it was there once the feeds reached its position (at %d): late, not lost", at)
	default:
		return fmt.Sprintf("LOST: it was not there with the feeds at %d (the page below it begins %v)", at, page.IDs[:min(3, len(page.IDs))])
	}
}

// pollUntilSeen reads user's first feed page until post is on it. At hundreds
// of posts a second a follower's first page may move past a post between two
// polls; when the first page is all newer than the post, a read from just
// above the post says whether it has arrived.
func (r *runner) pollUntilSeen(ctx context.Context, p *phase, user domain.UserID, post domain.PostID, acceptedAt time.Time) (time.Duration, bool) {
	deadline := acceptedAt.Add(r.cfg.FreshTimeout)
	above := aboveCursor(post)
	for {
		seen, err := r.seen(ctx, p, user, post, above)
		if err == nil && seen {
			return time.Since(acceptedAt), true
		}
		wait := pollWait(time.Since(acceptedAt))
		if time.Now().Add(wait).After(deadline) {
			return 0, false
		}
		select {
		case <-ctx.Done():
			return 0, false
		case <-time.After(wait):
		}
	}
}

// aboveCursor is the feed cursor whose page begins with post, if it is there.
func aboveCursor(post domain.PostID) string {
	return fmt.Sprintf("%d:%d", post+1, domain.IDTime(int64(post)+1).Unix())
}

// seen reports whether post is on user's first page, or, if the first page
// has moved past it, first on the page read from just above it.
func (r *runner) seen(ctx context.Context, p *phase, user domain.UserID, post domain.PostID, above string) (bool, error) {
	start := time.Now()
	page, _, err := r.api.feed(ctx, user, "", 0)
	p.record(kindPoll, start, err)
	if err != nil {
		return false, err
	}
	ids := page.IDs
	if slices.Contains(ids, post) {
		return true, nil
	}
	if len(ids) == 0 || ids[len(ids)-1] < post || !page.HasMore {
		return false, nil
	}
	start = time.Now()
	page, _, err = r.api.feed(ctx, user, above, 0)
	p.record(kindPoll, start, err)
	if err != nil {
		return false, err
	}
	ids = page.IDs
	return len(ids) > 0 && ids[0] == post, nil
}
