package fanout

import (
	"time"

	"github.com/feedproject/feed/projections/feeds/inbox"
)

// EncodeWork encodes work items as a fan-out message's body.
func EncodeWork(items []inbox.Item) ([]byte, error) { return encodeWork(items) }

// DecodeWork decodes a fan-out message's work items.
func DecodeWork(data []byte) ([]inbox.Item, error) { return decodeWork(data) }

// SetBeforeApply makes fn run before each message's work is applied; its
// error fails the message.
func (a *Applier) SetBeforeApply(fn func([]inbox.Item) error) { a.beforeApply = fn }

// SetBeforePlan makes fn run between a batch's first round trip to Redis and
// its plan's.
func (p *Planner) SetBeforePlan(fn func()) { p.beforePlan = fn }

// SetAppliersStall sets how long p waits for appliers that apply nothing.
func (p *Planner) SetAppliersStall(d time.Duration) { p.stall = d }

// ErrStateLost is the planner's error for a Redis that lost its state.
var ErrStateLost = errStateLost
