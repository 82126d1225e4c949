package fanout

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

// publish sends the work, chunked, to each partition's subject and waits for
// the log to store it. Online recipients' work goes first, in messages of its
// own (see Online).
func (p *Planner) publish(ctx context.Context, w *work, first, last uint64) error {
	if w.n == 0 {
		return nil
	}
	var acks []jetstream.PubAckFuture
	// The body's share of the server's largest payload: headers take a few
	// dozen bytes.
	limit := int(p.js.Conn().MaxPayload()) - 1024
	send := func(part int, items []inbox.Item, online bool) error {
		for len(items) > 0 {
			n := min(len(items), p.cfg.ItemsPerMessage)
			data, err := encodeWork(items[:n])
			if err != nil {
				return err
			}
			// Items differ in size (a follow's carries up to an outbox of
			// posts), and the server refuses a message over its largest
			// payload: that batch would fail for ever. Fewer items, in
			// proportion, until the message fits.
			for len(data) > limit && n > 1 {
				n = max(1, min(n-1, n*limit/len(data)*9/10))
				if data, err = encodeWork(items[:n]); err != nil {
					return err
				}
			}
			// No dedup id: work published again after a rewind must be delivered
			// (an inbox built meanwhile needs it), and the inboxes' sequence guard
			// makes a second delivery change nothing.
			msg := nats.NewMsg(fmt.Sprintf("%s.%d", p.cfg.fanout.Subject, part))
			msg.Data = data
			msg.Header.Set(versionHeader, strconv.FormatInt(p.store.Version(), 10))
			// The first log sequence the work comes from: the feeds' position is
			// just below the oldest work not yet applied.
			msg.Header.Set(fromHeader, strconv.FormatUint(first, 10))
			if !w.occurred.IsZero() {
				msg.Header.Set(occurredHeader, strconv.FormatInt(w.occurred.UnixMilli(), 10))
			}
			if online {
				msg.Header.Set(onlineHeader, "1")
			}
			ack, err := p.js.PublishMsgAsync(msg)
			if err != nil {
				return fmt.Errorf("publish work: %w", err)
			}
			acks = append(acks, ack)
			if len(acks) == publishWindow {
				if err := awaitAcks(ctx, acks, ackWait); err != nil {
					return err
				}
				acks = acks[:0]
			}
			items = items[n:]
		}
		return nil
	}
	var groups recipientGroups
	for part, items := range w.parts {
		// Each recipient's items together, in their order: a message then
		// holds long runs of one recipient's pushes, which an applier puts
		// into the inbox at once (see apply.lua), and which the body encodes
		// with the recipient once (see encodeWork), rather than a post's
		// followers one after another.
		items = groups.arrange(items)
		online, rest := groups.online(items, w.online)
		if err := send(part, online, true); err != nil {
			return err
		}
		if err := send(part, rest, false); err != nil {
			return err
		}
	}
	return awaitAcks(ctx, acks, ackWait)
}

// publishWindow bounds the planner's messages awaiting their acks. The
// JetStream context's publishers share a bound of their own (4 000 by
// default), and a publish that waits for room longer than a fifth of a
// second fails: a batch cut into thousands of messages (the planner tests'
// five items a message) failed that way under load, and filled the room the
// API's commands publish in.
const publishWindow = 256

// ackWait bounds the wait for published work's acks. An ack the server
// never sends (its node killed as it stored the message) held the planner
// for ever, shutdown included: the batch fails instead, and is planned
// again (work delivered twice changes nothing).
const ackWait = 10 * time.Second

// awaitAcks waits, at most wait, for the server's acks of published work.
func awaitAcks(ctx context.Context, acks []jetstream.PubAckFuture, wait time.Duration) error {
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	for _, a := range acks {
		select {
		case <-a.Ok():
		case err := <-a.Err():
			return fmt.Errorf("publish work: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-timeout.C:
			return fmt.Errorf("publish work: no ack within %s: %w", wait, domain.ErrUnavailable)
		}
	}
	return nil
}

// oldestOccurrence is when the earliest of recs occurred (zero if none says).
func oldestOccurrence(recs []events.Record) time.Time {
	var t time.Time
	for _, rec := range recs {
		if !rec.OccurredAt.IsZero() && (t.IsZero() || rec.OccurredAt.Before(t)) {
			t = rec.OccurredAt
		}
	}
	return t
}

// recipientGroups puts each recipient's items together, in their order, the
// recipients in the order they first appear. It is a counting sort in two
// passes over the items, where a stable sort by recipient took some
// n·log n comparisons and moves of 64-byte items on the planner's serial
// path. Its buffers serve one partition after another.
type recipientGroups struct {
	index map[domain.UserID]int
	// group is each item's group; next, each group's next place in out.
	group []int
	next  []int
	out   []inbox.Item
	// first holds the online recipients' items; last is the recipient
	// looked up last.
	first []inbox.Item
	last  domain.UserID
}

// arrange returns items grouped by recipient: items itself if they already
// are (a materialisation's, one each), else a slice of g's that is valid
// until its next call.
func (g *recipientGroups) arrange(items []inbox.Item) []inbox.Item {
	if g.index == nil {
		g.index = make(map[domain.UserID]int)
	}
	clear(g.index)
	g.group, g.next = g.group[:0], g.next[:0]
	runs := 0
	for i, it := range items {
		if i == 0 || it.Recipient != items[i-1].Recipient {
			runs++
		}
		k, ok := g.index[it.Recipient]
		if !ok {
			k = len(g.next)
			g.index[it.Recipient] = k
			g.next = append(g.next, 0)
		}
		g.group = append(g.group, k)
		g.next[k]++
	}
	if runs == len(g.next) {
		return items
	}
	at := 0
	for k, n := range g.next {
		g.next[k] = at
		at += n
	}
	g.out = slices.Grow(g.out[:0], len(items))[:len(items)]
	for i, it := range items {
		k := g.group[i]
		g.out[g.next[k]] = it
		g.next[k]++
	}
	return g.out
}

// online splits items, grouped by recipient, into those of the recipients in
// users and the others, each in their order: the first in a buffer of g's
// valid until its next call, the others where items were. A recipient's items
// all go one way, so its work keeps its order.
func (g *recipientGroups) online(items []inbox.Item, users map[domain.UserID]struct{}) (first, rest []inbox.Item) {
	if len(users) == 0 {
		return nil, items
	}
	g.first = g.first[:0]
	rest = items[:0]
	on := false
	for i, it := range items {
		if i == 0 || it.Recipient != g.last {
			_, on = users[it.Recipient]
			g.last = it.Recipient
		}
		if on {
			g.first = append(g.first, it)
		} else {
			rest = append(rest, it)
		}
	}
	return g.first, rest
}
