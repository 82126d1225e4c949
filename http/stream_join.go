package http

import (
	"context"
	"errors"
	"time"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/readmodel"
)

// recent is an event the dispatcher handed out, with what it found out
// about it: whose activity item it may make (see activityOwner) and, for a
// post, its body if it encoded one.
type recent struct {
	rec          events.Record
	owner        domain.UserID
	known, maybe bool
	body         []byte
}

// recentRing holds the last events dispatched, in log order, as many as
// its ring holds.
type recentRing struct {
	ring []recent
	// next is where the next event goes; n, how many are held.
	next, n int
}

func (r *recentRing) add(e recent) {
	r.ring[r.next] = e
	r.next = (r.next + 1) % len(r.ring)
	r.n = min(r.n+1, len(r.ring))
}

// at is the event at seq, if held; last is the newest event's position.
func (r *recentRing) at(seq, last uint64) (*recent, bool) {
	back := last - seq // 0 for the newest
	if seq > last || back >= uint64(r.n) {
		return nil, false
	}
	i := (r.next - 1 - int(back) + 2*len(r.ring)) % len(r.ring)
	return &r.ring[i], true
}

// endTurn tells the streams waiting for the dispatcher to end an event that
// it has. The caller holds mu.
func (s *Streams) endTurn() {
	close(s.turn)
	s.turn = make(chan struct{})
}

// eventsPerRecord is the most events one record of the log makes for one
// viewer: its own, and an item of activity.
const eventsPerRecord = 2

// join brings v from its position to the dispatcher's, queuing the events
// on the way, and attaches it there: from the recent events, in memory,
// when they reach back to v's position, else by reading the log until they
// do.
func (s *Streams) join(ctx context.Context, v *viewer, enqueue func(streamEvent) error) error {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	from := "memory"
	for {
		joined, err := s.catchUp(ctx, v)
		if joined {
			s.metrics.caughtUp.WithLabelValues(from).Inc()
		}
		if joined || err != nil {
			return err
		}
		from = "log"
		if err := s.replay(ctx, v, enqueue); err != nil {
			return err
		}
	}
}

// catchUp attaches v once it has queued the recent events after its
// position, waiting for the dispatcher to end the event it is handing out
// and for v's writer to make room. False if the recent events no longer
// reach back to v's position.
func (s *Streams) catchUp(ctx context.Context, v *viewer) (bool, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return false, errStreamsClosed
		}
		if v.pos >= s.begun {
			s.attach(v)
			s.mu.Unlock()
			return true, nil
		}
		wait := s.turn
		if s.begun == s.last {
			for v.pos < s.last && cap(v.queue)-len(v.queue) >= eventsPerRecord {
				e, ok := s.recent.at(v.pos+1, s.last)
				if !ok {
					s.mu.Unlock()
					return false, nil
				}
				s.catchUpWith(v, e)
			}
			// Joined with room for the dispatcher's events.
			if v.pos == s.last && len(v.queue) <= cap(v.queue)/2 {
				s.attach(v)
				s.mu.Unlock()
				return true, nil
			}
			// Its writer makes room.
			wait = nil
		}
		s.mu.Unlock()
		if wait == nil {
			for len(v.queue) > cap(v.queue)/2 {
				select {
				case <-ctx.Done():
					return false, ctx.Err()
				case <-time.After(5 * time.Millisecond):
				}
			}
			continue
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// catchUpWith queues v's events of e, for which its queue has room, as the
// dispatcher would have. The caller holds mu.
func (s *Streams) catchUpWith(v *viewer, e *recent) {
	for _, ev := range v.events(e.rec, v.pendingItem(e.owner, e.known, e.maybe)) {
		if ev.kind == kindPost {
			if e.body == nil {
				e.body = appendPost(nil, readmodel.CreatedPost(ev.created))
			}
			ev.body = e.body
		}
		ev.live = true
		v.queue <- ev
	}
	v.pos = e.rec.Seq
}

// pendingItem is the activity item an event whose item's owner is owner
// (if known; maybe: an item at all) may make for v: one its writer finds as
// it writes it, as the dispatcher's, so that neither catching up nor the
// dispatch waits for the activity projection.
func (v *viewer) pendingItem(owner domain.UserID, known, maybe bool) []ActivityItem {
	if maybe && (!known || owner == v.user) {
		return []ActivityItem{{User: v.user}}
	}
	return nil
}

// replay reads the log after v's position, queuing v's events, until the
// recent events reach back to where it is.
func (s *Streams) replay(ctx context.Context, v *viewer, enqueue func(streamEvent) error) error {
	select {
	case s.catchUps <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.catchUps }()
	err := s.log.Read(ctx, events.ReadOptions{FromSeq: v.pos + 1, IncludeUnknown: true}, func(rec events.Record) error {
		var items []ActivityItem
		if s.activity != nil {
			items = v.pendingItem(s.activityOwner(ctx, rec))
		}
		for _, ev := range v.events(rec, items) {
			if err := enqueue(ev); err != nil {
				return err
			}
		}
		v.pos = rec.Seq
		if s.inReach(v) {
			return errInReach
		}
		return nil
	})
	switch {
	case errors.Is(err, errInReach):
		return nil
	case err != nil:
		return err
	default:
		return ctx.Err()
	}
}

// errInReach ends a replay that the recent events reach.
var errInReach = errors.New("within the recent events")

// inReach reports whether the recent events reach back to v's position.
func (s *Streams) inReach(v *viewer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v.pos >= s.last {
		return true
	}
	_, ok := s.recent.at(v.pos+1, s.last)
	return ok
}
