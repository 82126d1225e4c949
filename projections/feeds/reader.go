package feeds

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
)

// Reader is the read side of the home feed in Redis.
type Reader struct {
	base *Store
	js   jetstream.JetStream
	// cur is the store of the keyspace version in use as of checked (unix
	// nanoseconds).
	cur     atomic.Pointer[Store]
	checked atomic.Int64

	// stream is the fan-out stream's handle, looked up once: every read asks
	// for the feeds' position, and a lookup is itself a request to JetStream.
	mu     sync.Mutex
	stream jetstream.Stream
}

// NewReader returns a reader of store; js finds the feeds' position.
func NewReader(store *Store, js jetstream.JetStream) *Reader {
	r := &Reader{base: store, js: js}
	r.cur.Store(store)
	return r
}

// versionCheck is how often readers look up the keyspace version: a rebuild's
// switch reaches them within it, and the rebuild keeps the old version
// readable for longer (RebuildConfig.Grace).
const versionCheck = time.Second

// store is the store of the keyspace version in use.
func (r *Reader) store(ctx context.Context) *Store {
	now, last := time.Now().UnixNano(), r.checked.Load()
	if now-last >= int64(versionCheck) && r.checked.CompareAndSwap(last, now) {
		if s, err := r.base.Active(ctx); err == nil {
			r.cur.Store(s)
		}
	}
	return r.cur.Load()
}

// Page is the cached part of a home feed page for user (see Store.Page), with
// the posts of the big accounts the user follows merged in. minPos is the log
// position the page must reflect (see PageCache.Page); read from Redis, every
// page reflects what Redis holds.
func (r *Reader) Page(ctx context.Context, user domain.UserID, before int64, n int, _ uint64) (Page, error) {
	s := r.store(ctx)
	if page, ok, err := s.PageWithBig(ctx, user, before, n); ok {
		return page, err
	}
	big, err := s.BigAccounts(ctx)
	if err != nil {
		return Page{}, err
	}
	var followed []domain.UserID
	if len(big) > 0 {
		members := make([]any, len(big))
		for i, b := range big {
			members[i] = int64(b)
		}
		is, err := s.rdb.SMIsMember(ctx, s.userKey(user, stFollowsSuffix), members...).Result()
		if err != nil {
			return Page{}, stFail(fmt.Sprintf("big followees of %d", user), err)
		}
		for i, yes := range is {
			if yes {
				followed = append(followed, big[i])
			}
		}
	}
	return s.Page(ctx, user, followed, before, n)
}

// RequestMaterialise asks the planner to build the user's inbox.
func (r *Reader) RequestMaterialise(ctx context.Context, user domain.UserID) error {
	return r.store(ctx).RequestMaterialise(ctx, user)
}

// Position is how far the feeds reflect the log (see Position).
func (r *Reader) Position(ctx context.Context) (uint64, error) {
	planned, err := r.store(ctx).PlannerPosition(ctx)
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
	if err := s.rdb.SetNX(ctx, s.key(stPlannerPosKey), "0", 0).Err(); err != nil {
		return stFail("initialise planner position", err)
	}
	return nil
}

// advancePlannerPosition also records the batch's changes of the big
// accounts, in the same round trip, just before (not atomically: the two keys
// may be in different slots of a Cluster).
func (s *Store) advancePlannerPosition(ctx context.Context, from, to uint64, big map[domain.UserID]bool) error {
	var (
		ok  int
		err error
	)
	if len(big) == 0 {
		ok, err = advancePosition.Run(ctx, s.rdb, []string{s.key(stPlannerPosKey)},
			strconv.FormatUint(from, 10), strconv.FormatUint(to, 10)).Int()
	} else {
		ok, err = s.advanceWithBig(ctx, from, to, big)
	}
	if err != nil {
		return stFail("advance planner position", err)
	}
	if ok != 1 {
		return fmt.Errorf("planner position moved from %d during the batch: %w", from, errStateLost)
	}
	return nil
}

// plannerState is, in one round trip, the planner's position, whether its key
// exists at all (a missing key after the first batch means Redis lost the
// planner's state), and the keyspace version in use.
func (s *Store) plannerState(ctx context.Context) (seq uint64, stored bool, active int64, err error) {
	pipe := s.rdb.Pipeline()
	r := s.queuePlannerState(ctx, pipe)
	_, _ = pipe.Exec(ctx) // each command's error is looked at by r.result
	return r.result()
}

// plannerStateRead is plannerState's reads, queued on a pipeline.
type plannerStateRead struct{ pos, version *redis.StringCmd }

// queuePlannerState queues on pipe the reads of plannerState, so that they can
// share a round trip with others (see Planner.Apply).
func (s *Store) queuePlannerState(ctx context.Context, pipe redis.Pipeliner) plannerStateRead {
	return plannerStateRead{pos: pipe.Get(ctx, s.key(stPlannerPosKey)), version: pipe.Get(ctx, VersionKey)}
}

// result is what the reads found, once their pipeline has run.
func (r plannerStateRead) result() (seq uint64, stored bool, active int64, err error) {
	for _, c := range []*redis.StringCmd{r.pos, r.version} {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return 0, false, 0, stFail("read planner position", err)
		}
	}
	active = 1
	if v, err := r.version.Int64(); err == nil {
		active = v
	} else if !errors.Is(err, redis.Nil) {
		return 0, false, 0, fmt.Errorf("read the feeds' keyspace version: %w", err)
	}
	v, err := r.pos.Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, active, nil
	}
	seq, err = strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, false, 0, fmt.Errorf("read planner position: %q is not a sequence", v)
	}
	return seq, true, active, nil
}

// clearWarming lets users ask for their inbox again once their request is
// taken (an inbox that expires again soon must be rebuildable at once).
func (s *Store) clearWarming(ctx context.Context, users []domain.UserID) error {
	keys := make([]string, len(users))
	for i, u := range users {
		keys[i] = s.userKey(u, stWarmingSuffix)
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

func (s *Store) advanceWithBig(ctx context.Context, from, to uint64, big map[domain.UserID]bool) (int, error) {
	// Loaded first, so that the pipeline's EVALSHA finds it.
	if err := advancePosition.Load(ctx, s.rdb).Err(); err != nil {
		return 0, err
	}
	pipe := s.rdb.Pipeline()
	for u, b := range big {
		if b {
			pipe.SAdd(ctx, s.key(stBigKey), int64(u))
		} else {
			pipe.SRem(ctx, s.key(stBigKey), int64(u))
		}
	}
	adv := advancePosition.EvalSha(ctx, pipe, []string{s.key(stPlannerPosKey)}, strconv.FormatUint(from, 10), strconv.FormatUint(to, 10))
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	return adv.Int()
}
