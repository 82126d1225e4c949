package feeds

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
)

// Reader is the read side of the home feed in Redis.
type Reader struct {
	store *Store
	js    jetstream.JetStream

	// stream is the fan-out stream's handle, looked up once: every read asks
	// for the feeds' position, and a lookup is itself a request to JetStream.
	mu     sync.Mutex
	stream jetstream.Stream
}

// NewReader returns a reader of store; js finds the feeds' position.
func NewReader(store *Store, js jetstream.JetStream) *Reader {
	return &Reader{store: store, js: js}
}

// Page is the cached part of a home feed page for user (see Store.Page), with
// the posts of the big accounts the user follows merged in.
func (r *Reader) Page(ctx context.Context, user domain.UserID, before int64, n int) (Page, error) {
	big, err := r.store.BigAccounts(ctx)
	if err != nil {
		return Page{}, err
	}
	var followed []domain.UserID
	if len(big) > 0 {
		members := make([]any, len(big))
		for i, b := range big {
			members[i] = int64(b)
		}
		is, err := r.store.rdb.SMIsMember(ctx, stUserKey(user, stFollowsSuffix), members...).Result()
		if err != nil {
			return Page{}, stFail(fmt.Sprintf("big followees of %d", user), err)
		}
		for i, yes := range is {
			if yes {
				followed = append(followed, big[i])
			}
		}
	}
	return r.store.Page(ctx, user, followed, before, n)
}

// RequestMaterialise asks the planner to build the user's inbox.
func (r *Reader) RequestMaterialise(ctx context.Context, user domain.UserID) error {
	return r.store.RequestMaterialise(ctx, user)
}

// Position is how far the feeds reflect the log (see Position).
func (r *Reader) Position(ctx context.Context) (uint64, error) {
	planned, err := r.store.PlannerPosition(ctx)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	stream := r.stream
	r.mu.Unlock()
	if stream == nil {
		if stream, err = r.js.Stream(ctx, FanoutStream); err != nil {
			return 0, fmt.Errorf("feeds position: %w: %w", domain.ErrUnavailable, err)
		}
		r.mu.Lock()
		r.stream = stream
		r.mu.Unlock()
	}
	return positionAfter(ctx, planned, stream)
}

// advancePosition moves the planner's position from `from` to `to` only if it
// is still `from`: if Redis lost the planner's state during a batch (the key is
// gone or older), the batch must not be recorded as done on top of it.
var advancePosition = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
	redis.call('SET', KEYS[1], ARGV[2])
	return 1
end
return 0`)

// initPosition makes the planner's position key exist (at 0) before the first
// batch, so that its absence always means lost state.
func (s *Store) initPlannerPosition(ctx context.Context) error {
	if err := s.rdb.SetNX(ctx, stPlannerPosKey, "0", 0).Err(); err != nil {
		return stFail("initialise planner position", err)
	}
	return nil
}

func (s *Store) advancePlannerPosition(ctx context.Context, from, to uint64) error {
	ok, err := advancePosition.Run(ctx, s.rdb, []string{stPlannerPosKey},
		strconv.FormatUint(from, 10), strconv.FormatUint(to, 10)).Int()
	if err != nil {
		return stFail("advance planner position", err)
	}
	if ok != 1 {
		return fmt.Errorf("planner position moved from %d during the batch: %w", from, errStateLost)
	}
	return nil
}

// plannerState is the planner's position and whether its key exists at all
// (a missing key after the first batch means Redis lost the planner's state).
func (s *Store) plannerState(ctx context.Context) (seq uint64, stored bool, err error) {
	v, err := s.rdb.Get(ctx, stPlannerPosKey).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, stFail("read planner position", err)
	}
	seq, err = strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("read planner position: %q is not a sequence", v)
	}
	return seq, true, nil
}

// clearWarming lets users ask for their inbox again once their request is
// taken (an inbox that expires again soon must be rebuildable at once).
func (s *Store) clearWarming(ctx context.Context, users []domain.UserID) error {
	keys := make([]string, len(users))
	for i, u := range users {
		keys[i] = stUserKey(u, stWarmingSuffix)
	}
	// One DEL per key: in a Redis Cluster the users' keys live in other slots.
	pipe := s.rdb.Pipeline()
	for _, k := range keys {
		pipe.Del(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return stFail("clear materialisation requests", err)
	}
	return nil
}
