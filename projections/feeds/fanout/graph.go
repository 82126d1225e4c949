package fanout

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
)

// graphFacts is what decides how a batch's follows are planned, read before
// any of them is applied: the big accounts, whether each pair of the batch
// follows, and each followee's follower count. From them the planner knows
// the count after every follow, and so every change of an account's bigness,
// before it writes anything (see Planner.planBatch).
type graphFacts struct {
	big    map[domain.UserID]bool
	holds  map[projections.FollowPair]bool
	counts map[domain.UserID]int64
	// changed are the accounts whose bigness the batch changed, and to what.
	changed map[domain.UserID]bool
}

// readGraphFacts reads the facts of pairs in one round trip. It also makes sure
// Redis has the outbox function that the changes will run (a new Redis, a
// restart without persistence, FUNCTION FLUSH): a change that failed for want
// of it would leave the batch half made.
func readGraphFacts(ctx context.Context, s *feeds.Store, pairs []projections.FollowPair) (*graphFacts, error) {
	pipe := s.Client().Pipeline()
	r := queueFacts(ctx, s, pipe, pairs)
	_, _ = pipe.Exec(ctx) // each command's error is looked at by r.facts
	return r.facts(ctx)
}

// factsRead is readGraphFacts's reads, queued on a pipeline.
type factsRead struct {
	s       *feeds.Store
	scripts *redis.FunctionListCmd
	big     *redis.StringSliceCmd
	holds   map[projections.FollowPair]*redis.BoolCmd
	counts  map[domain.UserID]*redis.IntCmd
}

// queueFacts queues on pipe the reads of readGraphFacts, so that they can
// share a round trip with others (see Planner.Apply).
func queueFacts(ctx context.Context, s *feeds.Store, pipe redis.Pipeliner, pairs []projections.FollowPair) *factsRead {
	r := &factsRead{
		s:       s,
		scripts: pipe.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: feeds.OutboxFunction().Name()}),
		big:     pipe.SMembers(ctx, s.Keys().Big()),
		holds:   make(map[projections.FollowPair]*redis.BoolCmd, len(pairs)),
		counts:  map[domain.UserID]*redis.IntCmd{},
	}
	for _, pr := range pairs {
		key := s.Keys().Followers(pr.Followee)
		if _, ok := r.holds[pr]; !ok {
			r.holds[pr] = pipe.SIsMember(ctx, key, int64(pr.Follower))
		}
		if _, ok := r.counts[pr.Followee]; !ok {
			r.counts[pr.Followee] = pipe.SCard(ctx, key)
		}
	}
	return r
}

// facts is what the reads found, once their pipeline has run; it loads the
// outbox script if Redis lacks it.
func (r *factsRead) facts(ctx context.Context) (*graphFacts, error) {
	cmds := []redis.Cmder{r.scripts, r.big}
	for _, c := range r.holds {
		cmds = append(cmds, c)
	}
	for _, c := range r.counts {
		cmds = append(cmds, c)
	}
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return nil, feeds.Fail("read the follow graph", err)
		}
	}
	if len(r.scripts.Val()) == 0 {
		if err := feeds.OutboxFunction().Load(ctx, r.s.Client()); err != nil {
			return nil, feeds.Fail("read the follow graph", err)
		}
	}
	big, err := feeds.ParseUsers(r.big.Val(), "read big accounts", nil)
	if err != nil {
		return nil, err
	}
	f := &graphFacts{
		big:     make(map[domain.UserID]bool, len(big)),
		holds:   make(map[projections.FollowPair]bool, len(r.holds)),
		counts:  make(map[domain.UserID]int64, len(r.counts)),
		changed: map[domain.UserID]bool{},
	}
	for _, b := range big {
		f.big[b] = true
	}
	for pr, cmd := range r.holds {
		f.holds[pr] = cmd.Val()
	}
	for u, cmd := range r.counts {
		f.counts[u] = cmd.Val()
	}
	return f, nil
}

// follow records in f that follower follows followee (or no longer does) and
// returns the followee's follower count after it.
func (f *graphFacts) follow(pr projections.FollowPair, follow bool) int64 {
	n := f.counts[pr.Followee]
	switch {
	case follow && !f.holds[pr]:
		n++
	case !follow && f.holds[pr]:
		n--
	}
	f.holds[pr], f.counts[pr.Followee] = follow, n
	return n
}

// graphChanges queues the planner's changes of the graph and the outboxes
// (not of the big accounts: see work.bigChanges),
// and the reads that planning them needs, to be sent in one round trip. Redis
// runs a pipeline's commands in order (on a Cluster, those of one key: every
// read here follows the changes of its own key), so each read sees exactly
// the changes queued before it, as if each had been a round trip of its own.
type graphChanges struct {
	s    *feeds.Store
	ctx  context.Context
	pipe redis.Pipeliner
	// writes are the changes, whose failures fail the batch, and what each is.
	writes []redis.Cmder
	what   []string
}

func newGraphChanges(ctx context.Context, s *feeds.Store) *graphChanges {
	return &graphChanges{s: s, ctx: ctx, pipe: s.Client().Pipeline()}
}

func (g *graphChanges) write(cmd redis.Cmder, what string) {
	g.writes = append(g.writes, cmd)
	g.what = append(g.what, what)
}

// changeOutbox queues an outbox change (see feeds.Store.AddToOutbox,
// RemoveFromOutbox).
func (g *graphChanges) changeOutbox(c feeds.OutboxChange) {
	if c.Remove {
		key, post := g.s.Keys().Outbox(c.Author), strconv.FormatInt(int64(c.Post), 10)
		g.write(g.pipe.ZRem(g.ctx, key, post), fmt.Sprintf("remove post %d from outbox of user %d", c.Post, c.Author))
		return
	}
	g.write(g.s.QueueAddToOutbox(g.ctx, g.pipe, c.Author, c.Post),
		fmt.Sprintf("add post %d to outbox of user %d", c.Post, c.Author))
}

// followRead is what a follow's planning reads: the followee's follower count
// and outbox after it.
type followRead struct {
	followee domain.UserID
	count    *redis.IntCmd
	outbox   feeds.OutboxRead
}

func (r followRead) result() (int64, feeds.Outbox, error) {
	n, err := r.count.Result()
	if err != nil {
		return 0, feeds.Outbox{}, feeds.Fail(fmt.Sprintf("count followers of user %d", r.followee), err)
	}
	ob, err := r.outbox.Outbox()
	return n, ob, err
}

// changeFollow queues that follower follows followee (or no longer does) and
// the reads of the followee's follower count and outbox after it.
func (g *graphChanges) changeFollow(pr projections.FollowPair, follow bool) followRead {
	fol, fng := g.s.Keys().Followers(pr.Followee), g.s.Keys().Following(pr.Follower)
	what := fmt.Sprintf("record user %d follows %d: %t", pr.Follower, pr.Followee, follow)
	if follow {
		g.write(g.pipe.SAdd(g.ctx, fol, int64(pr.Follower)), what)
		g.write(g.pipe.SAdd(g.ctx, fng, int64(pr.Followee)), what)
	} else {
		g.write(g.pipe.SRem(g.ctx, fol, int64(pr.Follower)), what)
		g.write(g.pipe.SRem(g.ctx, fng, int64(pr.Followee)), what)
	}
	return followRead{
		followee: pr.Followee,
		count:    g.pipe.SCard(g.ctx, fol),
		outbox:   g.s.QueueWholeOutbox(g.ctx, g.pipe, pr.Followee),
	}
}

// usersRead is a read of a set of users.
type usersRead struct {
	cmd  *redis.StringSliceCmd
	what string
}

func (r usersRead) users() ([]domain.UserID, error) {
	return feeds.ParseUsers(r.cmd.Val(), r.what, r.cmd.Err())
}

// followers queues a read of user's followers.
func (g *graphChanges) followers(user domain.UserID) usersRead {
	return usersRead{g.pipe.SMembers(g.ctx, g.s.Keys().Followers(user)), fmt.Sprintf("read followers of user %d", user)}
}

// exec sends the changes and reads, and fails if a change failed. The batch
// may then be half made (as when the planner stops during it): the runner
// rewinds and plans it again from its first event, which every change allows.
func (g *graphChanges) exec() error {
	_, _ = g.pipe.Exec(g.ctx) // each command's error is looked at below
	for i, cmd := range g.writes {
		if err := cmd.Err(); err != nil {
			return feeds.Fail(g.what[i], err)
		}
	}
	return nil
}
