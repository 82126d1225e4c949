package events

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/feedproject/feed/domain"
)

// Event is a domain event payload. Each concrete type has one versioned type name
// that is persisted in the log and therefore never renamed or reused.
type Event interface {
	// Type is the versioned type name, e.g. "post.created.v1".
	Type() string
	// Actor is the user who caused the event.
	Actor() domain.UserID
	// Subject is the stream subject the event is appended to (see Subject).
	Subject() string
}

// Envelope is what is stored in the log for every event: the payload plus the
// facts every reader needs without understanding the payload.
type Envelope struct {
	// ID is unique per event and doubles as the Nats-Msg-Id used for dedup, so a
	// retried append with the same ID is stored once.
	ID         string          `json:"id"`
	Type       string          `json:"type"`
	OccurredAt time.Time       `json:"occurred_at"`
	Actor      domain.UserID   `json:"actor,string"`
	Payload    json.RawMessage `json:"payload"`
}

// NewEnvelope wraps ev; the id and time are passed in so callers decide them
// (and tests can fix them).
func NewEnvelope(id string, at time.Time, ev Event) (Envelope, error) {
	if id == "" {
		return Envelope{}, fmt.Errorf("envelope of %s: empty id: %w", ev.Type(), domain.ErrInvalid)
	}
	payload, err := json.Marshal(ev)
	if err != nil {
		return Envelope{}, fmt.Errorf("encode %s: %w", ev.Type(), err)
	}
	return Envelope{
		ID:         id,
		Type:       ev.Type(),
		OccurredAt: at.UTC().Truncate(time.Millisecond),
		Actor:      ev.Actor(),
		Payload:    payload,
	}, nil
}

// Record is an envelope read back from the log with its position.
type Record struct {
	Envelope
	// Seq is the stream sequence: the event's position in the total order.
	Seq     uint64
	Subject string
	// Event is the decoded payload, or nil when the type is unknown to this
	// build (a newer writer); readers skip such records and count them.
	Event Event
}
