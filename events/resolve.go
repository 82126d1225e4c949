package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/domain"
)

// errNotSent marks an append that failed before its message left the
// process: nothing can have been stored.
var errNotSent = errors.New("not sent")

// errMaybeStored marks an append whose message went out in a batch that
// failed without the server's refusal: it may be stored.
var errMaybeStored = errors.New("may be stored")

// unknownOutcome reports whether err, an append's failure, leaves it open
// whether the event was stored. Definite are a failure before sending, the
// server's own refusal (a failed expectation, a limit) and no server taking
// the message at all; anything else (a timeout, a connection lost while
// waiting for the acknowledgement) may have stored it.
func unknownOutcome(err error) bool {
	if errors.Is(err, errMaybeStored) {
		return true
	}
	return !errors.Is(err, errNotSent) && !refused(err) && !errors.Is(err, nats.ErrNoResponders) &&
		// The client refuses a publish while disconnected (it buffers none).
		!errors.Is(err, nats.ErrReconnectBufExceeded)
}

// refused reports whether err is the server's answer that it did not store
// a message.
func refused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr)
}

// resolve finds out whether msg, sent under its id with an outcome unknown,
// was stored, and stores it if it was not, so that the caller answers from
// what the log holds: the position, or a definite failure. It asks again
// until the log answers or cfg.ResolveTimeout passes (domain.ErrOutcomeUnknown).
//
// An unconditional append is simply sent again: within the dedup window the
// server answers a stored id with its first position (Duplicate). A
// conditional one cannot be, as the server checks the expectation before the
// id: if it was stored, it is the subject's next event after the expected
// one, read from the stream's leader.
func (l *Log) resolve(ctx context.Context, msg *nats.Msg, expect *uint64) (Appended, error) {
	ctx = context.WithoutCancel(ctx)
	deadline := time.Now().Add(l.cfg.ResolveTimeout)
	backoff := 50 * time.Millisecond
	for {
		attempt, cancel := context.WithTimeout(ctx, min(time.Until(deadline), 2*time.Second))
		res, done, err := l.resolveOnce(attempt, msg, expect)
		cancel()
		if done {
			l.metrics.observeResolved(true)
			return res, err
		}
		if time.Now().Add(backoff).After(deadline) {
			l.metrics.observeResolved(false)
			return Appended{}, fmt.Errorf("%w: event %s: %v", domain.ErrOutcomeUnknown, msg.Header.Get(jetstream.MsgIDHeader), err)
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

// resolveOnce makes one attempt of resolve; done is false while the outcome
// is still unknown.
func (l *Log) resolveOnce(ctx context.Context, msg *nats.Msg, expect *uint64) (_ Appended, done bool, _ error) {
	id := msg.Header.Get(jetstream.MsgIDHeader)
	if expect != nil {
		next, err := l.leaderGet(ctx, msgGetRequest{Seq: *expect + 1, NextFor: msg.Subject})
		switch {
		case err == nil && next.Header.Get(jetstream.MsgIDHeader) == id:
			return Appended{Seq: next.Sequence}, true, nil
		case err == nil:
			// Another event took the place: this one can never be stored.
			return Appended{}, true, fmt.Errorf("event %s: subject %s moved past %d: %w", id, msg.Subject, *expect, domain.ErrConflict)
		case !errors.Is(err, domain.ErrNotFound):
			return Appended{}, false, err
		}
	}
	res, err := publishOne(ctx, l.js, msg)
	if err == nil {
		return res, true, nil
	}
	if refused(err) {
		// A stored id would have been answered as a duplicate.
		return Appended{}, true, classify(err)
	}
	return Appended{}, false, err
}

// msgGetRequest is the stream API's request for one message.
type msgGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	NextFor string `json:"next_by_subj,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
}

// leaderGet reads one message through the stream's leader. A direct get may
// be served by any replica, including one that has not stored the newest
// events yet; the leader has every acknowledged event.
func (l *Log) leaderGet(ctx context.Context, req msgGetRequest) (*jetstream.RawStreamMsg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	prefix := l.js.Options().APIPrefix
	if prefix == "" {
		prefix = jetstream.DefaultAPIPrefix
	}
	subject := prefix + "STREAM.MSG.GET." + l.cfg.Name
	resp, err := l.js.Conn().RequestWithContext(ctx, subject, body)
	if err != nil {
		return nil, fmt.Errorf("get from stream %s: %w", l.cfg.Name, classify(err))
	}
	var answer struct {
		Error *jetstream.APIError `json:"error"`
		Msg   *struct {
			Subject  string    `json:"subject"`
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs"`
			Data     []byte    `json:"data"`
			Time     time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(resp.Data, &answer); err != nil {
		return nil, fmt.Errorf("get from stream %s: bad answer: %w", l.cfg.Name, err)
	}
	if answer.Error != nil {
		if answer.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, fmt.Errorf("stream %s: %w", l.cfg.Name, domain.ErrNotFound)
		}
		return nil, fmt.Errorf("get from stream %s: %w", l.cfg.Name, classify(answer.Error))
	}
	if answer.Msg == nil {
		return nil, fmt.Errorf("get from stream %s: an answer without a message", l.cfg.Name)
	}
	m := &jetstream.RawStreamMsg{Subject: answer.Msg.Subject, Sequence: answer.Msg.Sequence, Data: answer.Msg.Data, Time: answer.Msg.Time}
	if len(answer.Msg.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(answer.Msg.Header); err != nil {
			return nil, fmt.Errorf("get from stream %s: headers: %w", l.cfg.Name, err)
		}
	}
	return m, nil
}
