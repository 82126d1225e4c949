package loadbench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/feedproject/feed/domain"
)

// runner is one run of the bench.
type runner struct {
	cfg      Config
	target   Target
	graph    *Graph
	images   [][]byte // prepared PNGs, made unique per post
	api      *client
	progress io.Writer
	report   *Report

	slots chan struct{} // one per open-loop request in flight
	fresh chan struct{} // one per freshness poller running
	// unseen counts the sampled posts never seen on a poller's feed, the
	// first few of which are logged.
	unseen atomic.Int64
	tasks  sync.WaitGroup

	postsPlanned atomic.Uint64 // numbers each post's image

	// Totals since the start, for the sampler's per-second rates.
	commandsDone, readsDone atomic.Int64
	// maxPosition is the highest log position a command was answered with.
	maxPosition atomic.Uint64

	posts *recentPosts
	// viewers, while set, hold streams open and time announcements.
	viewers *viewers
	stage   atomic.Value // string: the step of the run, for the samples

	cursorMu sync.Mutex
	cursors  []string // each user's next-page cursor, by user-1
}

func (r *runner) setStage(name string) { r.stage.Store(name) }

func (r *runner) stageName() string {
	s, _ := r.stage.Load().(string)
	return s
}

// noteDone counts a finished request for the sampler's rates.
func (r *runner) noteDone(k kind, pos uint64) {
	switch {
	case k.isCommand():
		r.commandsDone.Add(1)
		for {
			cur := r.maxPosition.Load()
			if pos <= cur || r.maxPosition.CompareAndSwap(cur, pos) {
				break
			}
		}
	case k == kindFeed || k == kindFeedNext:
		r.readsDone.Add(1)
	}
}

// arrival is one planned request: made by a schedule's goroutine (so its
// random choices are repeatable), run in a goroutine of its own.
type arrival func(ctx context.Context, p *phase, intended time.Time)

// openLoop plans arrivals at rate per second at the intended times from,
// from+1/rate, … until end, and runs each without waiting for the others:
// latency is measured from the intended time, so a slow answer cannot delay
// the arrivals after it and hide itself (no coordinated omission). An arrival
// that finds MaxInFlight requests outstanding is dropped and counted.
func (r *runner) openLoop(ctx context.Context, rate float64, phases []*phase, plan func(intended time.Time) arrival) {
	if rate <= 0 {
		return
	}
	from, end := phases[0].start, phases[len(phases)-1].end
	interval := time.Duration(float64(time.Second) / rate)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for t := from; t.Before(end); t = t.Add(interval) {
		if d := time.Until(t); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		p := phaseAt(phases, t)
		a := plan(t)
		if a == nil {
			p.skipped.Add(1)
			continue
		}
		select {
		case r.slots <- struct{}{}:
		default:
			p.dropped.Add(1)
			continue
		}
		r.tasks.Go(func() {
			defer func() { <-r.slots }()
			p.late.Record(time.Since(t))
			a(ctx, p, t)
		})
	}
}

// phaseAt is the phase whose time span holds t: phases follow one another.
func phaseAt(phases []*phase, t time.Time) *phase {
	for i := len(phases) - 1; i > 0; i-- {
		if !t.Before(phases[i].start) {
			return phases[i]
		}
	}
	return phases[0]
}

// schedule runs one openLoop per rate (each with its own random source) over
// the phases, which follow one another without a gap, and waits for the loops
// and their requests.
func (r *runner) schedule(ctx context.Context, rng *rand.Rand, phases []*phase, loops []loop) {
	var wg sync.WaitGroup
	for _, l := range loops {
		lrng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		wg.Go(func() { r.openLoop(ctx, l.rate, phases, l.plan(lrng)) })
	}
	wg.Wait()
	r.tasks.Wait()
}

// loop is one open-loop arrival stream.
type loop struct {
	rate float64
	plan func(rng *rand.Rand) func(time.Time) arrival
}

// mixedLoops are the mixed workload's arrival streams.
func (r *runner) mixedLoops() []loop {
	return []loop{
		{r.cfg.PostRate, r.planPost},
		{r.cfg.FollowRate, r.planFollow},
		{r.cfg.LikeRate, r.planLike},
		{r.cfg.CommentRate, r.planComment},
		{r.cfg.ReadRate, func(rng *rand.Rand) func(time.Time) arrival { return r.planRead(rng, r.cfg.NextPageShare) }},
	}
}

func (r *runner) randomUser(rng *rand.Rand) domain.UserID {
	return domain.UserID(rng.IntN(r.graph.Users()) + 1)
}

// planPost: a random author posts one of the prepared images, made unique;
// some posts have their freshness measured.
func (r *runner) planPost(rng *rand.Rand) func(time.Time) arrival {
	budget := newFreshBudget(r.cfg.FreshRate)
	bigs := r.graph.BigAccounts()
	return func(intended time.Time) arrival {
		author := r.randomUser(rng)
		if len(bigs) > 0 && rng.Float64() < r.cfg.BigPostShare {
			author = bigs[rng.IntN(len(bigs))]
		}
		n := r.postsPlanned.Add(1)
		img := uniquePNG(r.images[rng.IntN(len(r.images))], n)
		big := r.graph.IsBig(author)
		var pollers []domain.UserID
		if budget.take(big, intended) {
			pollers = sample(rng, r.graph.Followers(author), r.cfg.FreshFollowers)
		}
		return func(ctx context.Context, p *phase, intended time.Time) {
			form, err := postForm(fmt.Sprintf("bench post %d", n), img)
			if err != nil {
				p.record(kindPost, intended, err)
				return
			}
			id, pos, err := r.api.post(ctx, author, form)
			p.record(kindPost, intended, err)
			if err != nil {
				return
			}
			acceptedAt := time.Now()
			r.noteDone(kindPost, pos)
			r.posts.add(id)
			if r.viewers != nil {
				r.viewers.posted(id, big, acceptedAt, p)
			}
			if !big {
				p.fanout.Add(int64(len(r.graph.Followers(author))))
			}
			r.trackFreshness(ctx, p, author, id, pos, big, acceptedAt, pollers)
		}
	}
}

// planFollow churns follows outside the generated graph (whose edges the
// freshness poller relies on): it follows a random pair, or unfollows one it
// followed earlier, about as often.
func (r *runner) planFollow(rng *rand.Rand) func(time.Time) arrival {
	var active []Edge
	seen := map[Edge]bool{}
	return func(time.Time) arrival {
		if len(active) > 0 && (rng.IntN(2) == 0 || len(active) >= r.graph.Users()) {
			i := rng.IntN(len(active))
			e := active[i]
			active[i] = active[len(active)-1]
			active = active[:len(active)-1]
			delete(seen, e)
			return r.followArrival(e, false)
		}
		for range 10 {
			e := Edge{Follower: r.randomUser(rng), Followee: r.randomUser(rng)}
			if e.Follower == e.Followee || seen[e] || r.graph.Follows(e.Follower, e.Followee) {
				continue
			}
			seen[e] = true
			active = append(active, e)
			return r.followArrival(e, true)
		}
		return nil
	}
}

func (r *runner) followArrival(e Edge, follow bool) arrival {
	k := kindFollow
	if !follow {
		k = kindUnfollow
	}
	return func(ctx context.Context, p *phase, intended time.Time) {
		pos, err := r.api.follow(ctx, e.Follower, e.Followee, follow)
		p.record(k, intended, err)
		if err == nil {
			r.noteDone(k, pos)
		}
	}
}

// planLike: a random user likes a recent post.
func (r *runner) planLike(rng *rand.Rand) func(time.Time) arrival {
	return func(time.Time) arrival {
		post, ok := r.posts.random(rng)
		if !ok {
			return nil
		}
		user := r.randomUser(rng)
		return func(ctx context.Context, p *phase, intended time.Time) {
			pos, err := r.api.like(ctx, user, post)
			p.record(kindLike, intended, err)
			if err == nil {
				r.noteDone(kindLike, pos)
			}
		}
	}
}

// planComment: a random user comments on a recent post.
func (r *runner) planComment(rng *rand.Rand) func(time.Time) arrival {
	return func(time.Time) arrival {
		post, ok := r.posts.random(rng)
		if !ok {
			return nil
		}
		user := r.randomUser(rng)
		text := fmt.Sprintf("bench comment %d", rng.IntN(1_000_000))
		return func(ctx context.Context, p *phase, intended time.Time) {
			pos, err := r.api.comment(ctx, user, post, text)
			p.record(kindComment, intended, err)
			if err == nil {
				r.noteDone(kindComment, pos)
			}
		}
	}
}

// planRead: a random user reads their feed: with probability nextShare the
// page after their last one (when there is one), else the first page.
func (r *runner) planRead(rng *rand.Rand, nextShare float64) func(time.Time) arrival {
	return func(time.Time) arrival {
		user := r.randomUser(rng)
		next := nextShare > 0 && rng.Float64() < nextShare
		return func(ctx context.Context, p *phase, intended time.Time) {
			cursor, k := "", kindFeed
			if next {
				if cursor = r.cursor(user); cursor != "" {
					k = kindFeedNext
				}
			}
			if nextShare == 0 {
				// Nothing of the page is used: it is read, not decoded.
				err := r.api.firstPage(ctx, user)
				p.record(k, intended, err)
				if err == nil {
					r.noteDone(k, 0)
				}
				return
			}
			page, _, err := r.api.feed(ctx, user, cursor, 0)
			p.record(k, intended, err)
			if err != nil {
				return
			}
			r.noteDone(k, 0)
			c := ""
			if page.HasMore && page.NextCursor != "" {
				c = page.NextCursor
			}
			r.setCursor(user, c)
		}
	}
}

func (r *runner) cursor(u domain.UserID) string {
	r.cursorMu.Lock()
	defer r.cursorMu.Unlock()
	return r.cursors[u-1]
}

func (r *runner) setCursor(u domain.UserID, c string) {
	r.cursorMu.Lock()
	defer r.cursorMu.Unlock()
	r.cursors[u-1] = c
}

// sample is up to n distinct members of from, at random.
func sample(rng *rand.Rand, from []domain.UserID, n int) []domain.UserID {
	if len(from) <= n {
		return append([]domain.UserID(nil), from...)
	}
	out := make([]domain.UserID, 0, n)
	for _, i := range rng.Perm(len(from))[:n] {
		out = append(out, from[i])
	}
	return out
}

// recentPosts remembers the newest posts, for likes and comments.
type recentPosts struct {
	mu   sync.Mutex
	ring []domain.PostID
	next int
	full bool
}

func newRecentPosts(n int) *recentPosts { return &recentPosts{ring: make([]domain.PostID, n)} }

func (rp *recentPosts) add(id domain.PostID) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	rp.ring[rp.next] = id
	rp.next = (rp.next + 1) % len(rp.ring)
	rp.full = rp.full || rp.next == 0
}

func (rp *recentPosts) random(rng *rand.Rand) (domain.PostID, bool) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	n := rp.next
	if rp.full {
		n = len(rp.ring)
	}
	if n == 0 {
		return 0, false
	}
	return rp.ring[rng.IntN(n)], true
}
