package loadbench

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOpenLoopRecordsHowLateItStartsEachRequest: a loop that begins 100 ms
// after its phase's start sends the arrivals due before then at once, and
// records each one's delay as the generator's own.
func TestOpenLoopRecordsHowLateItStartsEachRequest(t *testing.T) {
	t.Parallel()
	start := time.Now().Add(-100 * time.Millisecond)
	p := newPhase("mixed", start, start.Add(200*time.Millisecond))
	r := &runner{slots: make(chan struct{}, 100)}
	var ran atomic.Int64
	r.openLoop(t.Context(), 100, []*phase{p}, func(time.Time) arrival {
		return func(context.Context, *phase, time.Time) { ran.Add(1) }
	})
	r.tasks.Wait()
	require.EqualValues(t, 20, ran.Load(), "arrivals: every 10 ms for 200 ms")
	assert.EqualValues(t, 20, p.late.Count())
	assert.GreaterOrEqual(t, p.late.Max(), 95*time.Millisecond, "the first, due 100 ms before the loop began")
}
