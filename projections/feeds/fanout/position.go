package fanout

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
)

// Position is how far the home feeds reflect the log: every event at or below
// it has been planned and its work applied.
func Position(ctx context.Context, store *feeds.Store, js jetstream.JetStream) (uint64, error) {
	// The planner's position first: it is stored after its work is published,
	// so if no work is pending afterwards, all work up to it was applied.
	planned, err := PlannerPosition(ctx, store)
	if err != nil {
		return 0, err
	}
	stream, err := js.Stream(ctx, FanoutStream)
	if err != nil {
		return 0, fmt.Errorf("feeds position: %w: %w", domain.ErrUnavailable, err)
	}
	return PositionAfter(ctx, planned, stream)
}

// PositionAfter finishes Position given the planner's position, read first,
// and the fan-out stream.
func PositionAfter(ctx context.Context, planned uint64, stream jetstream.Stream) (uint64, error) {
	for attempt := 0; ; attempt++ {
		info, err := stream.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("feeds position: %w: %w", domain.ErrUnavailable, err)
		}
		if info.State.Msgs == 0 {
			return planned, nil
		}
		oldest, err := stream.GetMsg(ctx, info.State.FirstSeq)
		if errors.Is(err, jetstream.ErrMsgNotFound) && attempt < 3 {
			continue // applied (and removed) between the two requests: look again
		}
		if err != nil {
			return 0, fmt.Errorf("feeds position: %w", err)
		}
		return positionOf(planned, oldest)
	}
}

// positionOf is the feeds' position given the planner's and the oldest work
// not yet applied.
func positionOf(planned uint64, oldest *jetstream.RawStreamMsg) (uint64, error) {
	from, err := strconv.ParseUint(oldest.Header.Get(fromHeader), 10, 64)
	if err != nil || from == 0 {
		return 0, fmt.Errorf("feeds position: work without %s", fromHeader)
	}
	return min(planned, from-1), nil
}

// PlannerPosition returns the log sequence the planner has finished (0 if it
// never ran).
func PlannerPosition(ctx context.Context, s *feeds.Store) (uint64, error) {
	seq, _, _, err := plannerState(ctx, s)
	return seq, err
}

// SetPlannerPosition records the log sequence the planner has finished.
func SetPlannerPosition(ctx context.Context, s *feeds.Store, seq uint64) error {
	if err := s.Client().Set(ctx, s.Keys().PlannerPosition(), strconv.FormatUint(seq, 10), 0).Err(); err != nil {
		return feeds.Fail(fmt.Sprintf("set planner position %d", seq), err)
	}
	return nil
}

// advancePosition moves the planner's position from `from` to `to` only if it
// is still `from`: if Redis lost the planner's state during a batch (the key is
// gone or older), the batch must not be recorded as done on top of it (0). A
// planner whose lease epoch (ARGV[3]) is below the one that last moved the
// position has lost the lease to another and moves nothing (-1); the
// position records the epoch of each move.
var advancePosition = redis.NewScript(`
local fenced = tonumber(redis.call('GET', KEYS[2]) or '0')
local epoch = tonumber(ARGV[3])
if fenced > epoch then
	return -1
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
	return 0
end
redis.call('SET', KEYS[1], ARGV[2])
if fenced < epoch then
	redis.call('SET', KEYS[2], ARGV[3])
end
return 1`)

// initPlannerPosition makes the planner's position key exist (at 0) before the first
// batch, so that its absence always means lost state.
func initPlannerPosition(ctx context.Context, s *feeds.Store) error {
	if err := s.Client().SetNX(ctx, s.Keys().PlannerPosition(), "0", 0).Err(); err != nil {
		return feeds.Fail("initialise planner position", err)
	}
	return nil
}

// advancePlannerPosition also records the batch's changes of the big
// accounts, in the same round trip, just before (not atomically: the two keys
// may be in different slots of a Cluster).
func advancePlannerPosition(ctx context.Context, s *feeds.Store, from, to, epoch uint64, big map[domain.UserID]bool) error {
	var (
		ok  int
		err error
	)
	keys := []string{s.Keys().PlannerPosition(), s.Keys().PlannerEpoch()}
	args := []any{strconv.FormatUint(from, 10), strconv.FormatUint(to, 10), strconv.FormatUint(epoch, 10)}
	if len(big) == 0 {
		ok, err = advancePosition.Run(ctx, s.Client(), keys, args...).Int()
	} else {
		ok, err = advanceWithBig(ctx, s, keys, args, big)
	}
	switch {
	case err != nil:
		return feeds.Fail("advance planner position", err)
	case ok == -1:
		return fmt.Errorf("%w: the planner's position was moved under a newer epoch than %d", projections.ErrFenced, epoch)
	case ok != 1:
		return fmt.Errorf("planner position moved from %d during the batch: %w", from, errStateLost)
	}
	return nil
}

// plannerState is, in one round trip, the planner's position, whether its key
// exists at all (a missing key after the first batch means Redis lost the
// planner's state), and the keyspace version in use.
func plannerState(ctx context.Context, s *feeds.Store) (seq uint64, stored bool, active int64, err error) {
	pipe := s.Client().Pipeline()
	r := queuePlannerState(ctx, s, pipe)
	_, _ = pipe.Exec(ctx) // each command's error is looked at by r.result
	return r.result()
}

// plannerStateRead is plannerState's reads, queued on a pipeline, and the
// epoch that last moved the position.
type plannerStateRead struct{ pos, version, epoch *redis.StringCmd }

// queuePlannerState queues on pipe the reads of plannerState, so that they can
// share a round trip with others (see Planner.Apply).
func queuePlannerState(ctx context.Context, s *feeds.Store, pipe redis.Pipeliner) plannerStateRead {
	return plannerStateRead{
		pos:     pipe.Get(ctx, s.Keys().PlannerPosition()),
		version: pipe.Get(ctx, feeds.VersionKey),
		epoch:   pipe.Get(ctx, s.Keys().PlannerEpoch()),
	}
}

// fenced fails with projections.ErrFenced if a newer epoch than epoch moved
// the position, once the reads' pipeline has run (a failed read is
// result's to report).
func (r plannerStateRead) fenced(epoch uint64) error {
	at, _ := strconv.ParseUint(r.epoch.Val(), 10, 64) // none, or a failed read (result's to report): 0
	if at <= epoch {
		return nil
	}
	return fmt.Errorf("%w: the planner's position was moved under epoch %d, this planner's is %d", projections.ErrFenced, at, epoch)
}

// result is what the reads found, once their pipeline has run.
func (r plannerStateRead) result() (seq uint64, stored bool, active int64, err error) {
	for _, c := range []*redis.StringCmd{r.pos, r.version, r.epoch} {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return 0, false, 0, feeds.Fail("read planner position", err)
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

// advanceWithBig is advancePlannerPosition with changes of the big accounts.
func advanceWithBig(ctx context.Context, s *feeds.Store, keys []string, args []any, big map[domain.UserID]bool) (int, error) {
	// Loaded first, so that the pipeline's EVALSHA finds it.
	if err := advancePosition.Load(ctx, s.Client()).Err(); err != nil {
		return 0, err
	}
	pipe := s.Client().Pipeline()
	for u, b := range big {
		if b {
			pipe.SAdd(ctx, s.Keys().Big(), int64(u))
		} else {
			pipe.SRem(ctx, s.Keys().Big(), int64(u))
		}
	}
	adv := advancePosition.EvalSha(ctx, pipe, keys, args...)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	return adv.Int()
}
