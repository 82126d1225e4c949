package domain

import (
	"fmt"
	"sync"
	"time"
)

// Post and comment ids are 53-bit integers laid out, high to low, as
// 41 bits of milliseconds since IDEpoch, 8 bits of node and 4 bits of sequence.
// Sorting by id sorts by creation time; ids of different nodes never collide; and
// every id is exact as a float64, so it can be a Redis score or a JavaScript
// number. 41 bits of milliseconds last until 2093.
const (
	idNodeBits = 8
	idSeqBits  = 4
	// MaxNode is the largest node number: each API replica needs its own.
	MaxNode  = 1<<idNodeBits - 1
	idSeqMax = 1<<idSeqBits - 1
)

// IDEpoch is the zero of the id clock. Persisted: never change it.
var IDEpoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// IDGenerator makes time-ordered ids for one node. It is safe for concurrent use.
type IDGenerator struct {
	node int64

	mu     sync.Mutex
	lastMS int64
	seq    int64
}

// NewIDGenerator returns the generator of node, which must be unique among the
// processes that create ids (FEED_NODE_ID) and in [0, MaxNode].
func NewIDGenerator(node int) (*IDGenerator, error) {
	if node < 0 || node > MaxNode {
		return nil, fmt.Errorf("node %d outside [0, %d]: %w", node, MaxNode, ErrInvalid)
	}
	return &IDGenerator{node: int64(node), lastMS: -1}, nil
}

// Next returns a new id for the time now and the creation time it encodes (now
// truncated to milliseconds, or slightly later if the clock went back or more than
// 16 ids were asked for within one millisecond): the time to store with the
// object, so that ordering by (created_at, id) and by id agree.
func (g *IDGenerator) Next(now time.Time) (int64, time.Time) {
	ms := now.Sub(IDEpoch).Milliseconds()
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case ms > g.lastMS:
		g.lastMS, g.seq = ms, 0
	case g.seq < idSeqMax:
		g.seq++
	default:
		// The millisecond is used up (or the clock went back): borrow the next
		// one rather than repeat or reorder ids.
		g.lastMS++
		g.seq = 0
	}
	id := g.lastMS<<(idNodeBits+idSeqBits) | g.node<<idSeqBits | g.seq
	return id, IDTime(id)
}

// IDTime returns the creation time encoded in an id made by an IDGenerator.
func IDTime(id int64) time.Time {
	return IDEpoch.Add(time.Duration(id>>(idNodeBits+idSeqBits)) * time.Millisecond)
}
