package loadbench

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/feedproject/feed/domain"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// TestLateOrLostAsksOnceTheFeedsReachThePost: a post its poller never saw is
// looked for from just above it, with the post's position as X-Min-Position,
// and called late, lost, or not yet reached by what that page and its
// X-Position say.
func TestLateOrLostAsksOnceTheFeedsReachThePost(t *testing.T) {
	const post, pos = domain.PostID(1000), 42
	var at uint64
	var ids string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		assert.Equal(t, aboveCursor(post), req.URL.Query().Get("cursor"))
		assert.Equal(t, "42", req.Header.Get("X-Min-Position"))
		w.Header().Set("X-Position", strconv.FormatUint(at, 10))
		fmt.Fprintf(w, `{"posts":[%s],"next_cursor":null,"has_more":false}`, ids)
	}))
	t.Cleanup(srv.Close)
	c, err := newClient(srv.URL, []string{"token"}, 1)
	require.NoError(t, err)
	r := &runner{api: c}

	at, ids = pos, `{"id":"1000"},{"id":"999"}`
	assert.Contains(t, r.lateOrLost(t.Context(), 1, post, pos), "late, not lost")
	at, ids = pos+5, `{"id":"999"}`
	assert.Contains(t, r.lateOrLost(t.Context(), 1, post, pos), "LOST: it was not there with the feeds at 47 (the page below it begins [999])")
	at = pos - 1
	assert.Contains(t, r.lateOrLost(t.Context(), 1, post, pos), "had not reached its position (they were at 41)")
}
