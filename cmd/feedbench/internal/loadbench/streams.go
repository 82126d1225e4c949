package loadbench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/feedproject/feed/domain"
)

// viewers hold open GET /stream connections of some users through the mixed
// phase and time each post's announcement: from the post's 202 to its event
// read from a follower's stream.
type viewers struct {
	r  *runner
	hc *http.Client
	wg sync.WaitGroup

	mu sync.Mutex
	// accepted is each post the workload made, by id, once its 202 came;
	// early are the announcements read before it did.
	accepted map[domain.PostID]acceptedPost
	early    map[domain.PostID][]time.Time

	// events counts the post events read; reconnects the streams opened again
	// after they ended (with Last-Event-ID).
	events, reconnects atomic.Int64
	// open is the streams connected now.
	open atomic.Int64
}

type acceptedPost struct {
	at  time.Time
	big bool
	p   *phase
}

// openViewers connects n users' streams, chosen at random, and returns once
// they are all answered; the streams read until ctx ends.
func (r *runner) openViewers(ctx context.Context, rng *rand.Rand, n int) (*viewers, error) {
	v := &viewers{
		r:        r,
		hc:       &http.Client{Transport: &http.Transport{MaxConnsPerHost: 0, DisableCompression: true}},
		accepted: map[domain.PostID]acceptedPost{},
		early:    map[domain.PostID][]time.Time{},
	}
	users := make([]domain.UserID, r.graph.Users())
	for i := range users {
		users[i] = domain.UserID(i + 1)
	}
	rng.Shuffle(len(users), func(i, j int) { users[i], users[j] = users[j], users[i] })
	users = users[:min(n, len(users))]
	answered := make(chan error, len(users))
	for _, u := range users {
		v.wg.Go(func() { v.follow(ctx, u, answered) })
	}
	var first error
	for range users {
		if err := <-answered; err != nil && first == nil {
			first = err
		}
	}
	return v, first
}

// close waits for the streams, which end with the context they were opened with.
func (v *viewers) close() {
	v.wg.Wait()
	v.hc.CloseIdleConnections()
}

// follow reads user's stream until ctx ends, opening it again where it
// left off when it ends; answered hears of the first connection.
func (v *viewers) follow(ctx context.Context, user domain.UserID, answered chan<- error) {
	last := ""
	first := true
	for ctx.Err() == nil {
		resp, err := v.connect(ctx, user, last)
		if first {
			answered <- err
			first = false
		}
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		if last != "" {
			v.reconnects.Add(1)
		}
		v.open.Add(1)
		last = v.read(resp, last)
		v.open.Add(-1)
		_ = resp.Body.Close()
	}
}

func (v *viewers) connect(ctx context.Context, user domain.UserID, last string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.r.api.base+"/stream", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", v.r.api.bearer[user-1])
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	resp, err := v.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("stream of user %d: %w", user, err)
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		return nil, fmt.Errorf("stream of user %d: status %d", user, resp.StatusCode)
	}
	return resp, nil
}

// read reads events until the stream ends, and returns the last id.
func (v *viewers) read(resp *http.Response, last string) string {
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	post := false
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case len(line) == 0:
			post = false
		case bytes.HasPrefix(line, []byte("id: ")):
			last = string(line[4:])
		case bytes.Equal(line, []byte("event: post")):
			post = true
		case post && bytes.HasPrefix(line, []byte("data: ")):
			if id, ok := postID(line); ok {
				v.announced(id, time.Now())
			}
		}
	}
	return last
}

// postID is the "id" of a post event's data line (the post's first field).
func postID(line []byte) (domain.PostID, bool) {
	const key = `"id":"`
	i := bytes.Index(line, []byte(key))
	if i < 0 {
		return 0, false
	}
	rest := line[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return domain.PostID(n), err == nil
}

// announced records a post event read at.
func (v *viewers) announced(id domain.PostID, at time.Time) {
	v.events.Add(1)
	v.mu.Lock()
	a, ok := v.accepted[id]
	if !ok {
		v.early[id] = append(v.early[id], at)
	}
	v.mu.Unlock()
	if ok && a.p != nil {
		a.p.announce.add(a.big, max(0, at.Sub(a.at)), true)
	}
}

// posted records a post's 202, in phase p (nil: unrecorded).
func (v *viewers) posted(id domain.PostID, big bool, at time.Time, p *phase) {
	v.mu.Lock()
	v.accepted[id] = acceptedPost{at: at, big: big, p: p}
	early := v.early[id]
	delete(v.early, id)
	v.mu.Unlock()
	if p == nil {
		return
	}
	for _, e := range early {
		// Announced before the 202 reached the bench: no later than it.
		p.announce.add(big, max(0, e.Sub(at)), true)
	}
}
