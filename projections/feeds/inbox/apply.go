package inbox

import (
	"context"
	_ "embed" // the apply script
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
)

// applyLua applies work items to inboxes (see its header for the layout).
//
//go:embed lua/apply.lua
var applyLua string

// applyFn is applyLua as Redis runs it, made once: its name is a hash of its
// code.
var applyFn = feeds.NewFunction("feed_apply", applyLua)

// inboxes are the inboxes of a store's keyspace version, as the scripts
// change and read them.
type inboxes struct{ *feeds.Store }

// callArgs bounds the arguments of an apply call that carries several
// recipients, and of a round trip of calls. A post's pushes to hundreds of
// followers share a call, which is what makes them cheap; a call carries at
// most about one whole-outbox merge or materialisation (some 500 posts each),
// and a round trip one call on a single Redis, so that an applier keeps Redis
// from its other clients (the planner, readers, the other appliers) for about
// a millisecond at a time. Redis runs every command a client's read brought
// (16 KiB) before it turns to the next client: pipelining all of a message's
// calls put some 10 ms of an applier's work ahead of each of the planner's
// round trips under the bench's load, and the planner makes four a batch.
const callArgs = 512

// catchUpItems and catchUpArgs: a message of catchUpItems items or more
// is sent in round trips of up to catchUpArgs arguments, four calls each,
// not one. Only a batch of hundreds of events makes a message that large, and
// the planner's batches grow that large only while the feeds are behind
// (PendingWork). Then each recipient's run is long, a call carries about one
// recipient, and a round trip of one call waits far longer than Redis works
// on it: appliers bound by their round trips apply at about the input's rate,
// so lag that built up never drains. Four calls a trip spread that wait over
// four times the work; while the feeds keep up, messages are smaller and the
// planner's round trips wait behind no more than one call (decision 40).
const (
	catchUpItems = 4000
	catchUpArgs  = 4 * callArgs
)

// Apply applies items to their recipients' inboxes and returns how many
// were applied (the rest were skipped: applied before, or the inbox is not
// materialised). Items of the same recipient are applied in the order given, all
// in one script run, so that no item can take effect after a later one of the
// same recipient failed. On a single Redis one script run carries many
// recipients (see callArgs); on a Cluster, which refuses keys of different
// slots in one run, or a Ring, it carries one. The runs are sent in rounds of
// about callArgs arguments, one round trip each (see callArgs), or of
// catchUpArgs when the items are catchUpItems or more. Invalid
// items fail the whole call before anything is written. On an error some
// recipients may have been updated; applying the same items again is safe.
func Apply(ctx context.Context, store *feeds.Store, items []Item) (applied int, err error) {
	return ApplyTimed(ctx, store, items, nil)
}

// ApplyTimed is Apply, telling round, if not nil, how long each round trip
// took.
func ApplyTimed(ctx context.Context, store *feeds.Store, items []Item, round func(time.Duration)) (applied int, err error) {
	return inboxes{store}.apply(ctx, items, round)
}

// apply is ApplyTimed.
func (s inboxes) apply(ctx context.Context, items []Item, round func(time.Duration)) (applied int, err error) {
	if len(items) == 0 {
		return 0, nil
	}
	for i, it := range items {
		if err := it.check(); err != nil {
			return 0, fmt.Errorf("apply feed items: item %d: %w", i, err)
		}
	}
	calls := s.pack(items)
	trip := callArgs
	if len(items) >= catchUpItems {
		trip = catchUpArgs
	}
	for len(calls) > 0 {
		k, size := 1, calls[0].size()
		for k < len(calls) && size+calls[k].size() <= trip {
			size += calls[k].size()
			k++
		}
		start := time.Now()
		n, err := s.runRound(ctx, calls[:k])
		if round != nil {
			round(time.Since(start))
		}
		applied += n
		if err != nil {
			return applied, err
		}
		calls = calls[k:]
	}
	return applied, nil
}

// runRound runs calls in one round trip, and again those Redis refused for
// want of the function, once it is loaded.
func (s inboxes) runRound(ctx context.Context, calls []*applyCall) (applied int, err error) {
	n, retry, err := s.runApply(ctx, calls)
	applied += n
	if err == nil && len(retry) > 0 {
		// Redis lacked the function (a new Redis, a restart without
		// persistence, FUNCTION FLUSH). The calls that failed wrote nothing, so
		// loading it and running them again keeps every recipient's order.
		if err := applyFn.Load(ctx, s.Client()); err != nil {
			return applied, feeds.Fail("apply feed items", err)
		}
		n, retry, err = s.runApply(ctx, retry)
		applied += n
		if err == nil && len(retry) > 0 {
			err = fmt.Errorf("apply feed items for %s: Lua functions flushed twice: %w", retry[0], domain.ErrUnavailable)
		}
	}
	return applied, err
}

// runApply pipelines the calls and returns how many items they applied and
// the calls refused because Redis lacked the function.
func (s inboxes) runApply(ctx context.Context, calls []*applyCall) (applied int, missing []*applyCall, err error) {
	pipe := s.Client().Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for i, c := range calls {
		cmds[i] = applyFn.FCall(ctx, pipe, c.keys, c.args(s.Config())...)
	}
	_, _ = pipe.Exec(ctx) // each command's error is looked at below
	for i, cmd := range cmds {
		res, cerr := cmd.Int64Slice()
		switch {
		case cerr == nil && len(res) == 2:
			applied += int(res[0])
			s.CountRepairs(res[1])
		case cerr == nil:
			err = fmt.Errorf("apply feed items for %s: unexpected answer %v", calls[i], res)
		case feeds.MissingFunction(cerr):
			missing = append(missing, calls[i])
		case err == nil:
			err = feeds.Fail(fmt.Sprintf("apply feed items for %s", calls[i]), cerr)
		}
	}
	return applied, missing, err
}
