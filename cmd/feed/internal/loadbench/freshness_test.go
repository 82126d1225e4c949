package loadbench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// polls is how many reads the poller makes of a post not seen before seen (or
// never, if seen is past timeout), reads taking no time.
func polls(seen, timeout time.Duration) int {
	n := 0
	for at := time.Duration(0); ; {
		n++
		if at >= seen {
			return n
		}
		wait := pollWait(at)
		if at+wait > timeout {
			return n
		}
		at += wait
	}
}

func TestPollScheduleIsFineAtTheTargetsAndCheapPastThem(t *testing.T) {
	assert.Equal(t, 20*time.Millisecond, pollWait(0))
	assert.Equal(t, 20*time.Millisecond, pollWait(299*time.Millisecond), "20 ms steps up to the ordinary target and past it")
	assert.Equal(t, 50*time.Millisecond, pollWait(300*time.Millisecond))
	assert.Equal(t, 250*time.Millisecond, pollWait(2*time.Second), "250 ms steps around the big authors' target")
	assert.Equal(t, time.Second, pollWait(2500*time.Millisecond))
	assert.Equal(t, time.Second, pollWait(time.Hour))

	assert.Equal(t, 11, polls(200*time.Millisecond, 10*time.Second), "a healthy post")
	assert.Equal(t, 35, polls(time.Hour, 10*time.Second), "a post never seen")
	assert.Equal(t, "every 20.0 ms to 300.0 ms, every 50.0 ms to 500.0 ms, every 250.0 ms to 2.50 s, then every 1.00 s", pollScheduleText())
}
