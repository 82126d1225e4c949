package events

import (
	"context"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
)

// DecodeWritten and DecodeGeneral are Decode's two paths, for tests that hold
// one to the other.
var DecodeWritten = decodeWritten

func (r *Registry) DecodeGeneral(data []byte) (Envelope, Event, error) { return r.decode(data) }

// Resolve finds out whether env, appended to subject under its id with an
// outcome unknown, is in the log, as Append does after a lost answer.
func (l *Log) Resolve(ctx context.Context, env Envelope, subject string, expect *uint64) (Appended, error) {
	msg, err := l.message(env, subject)
	if err != nil {
		return Appended{}, err
	}
	if expect != nil {
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(*expect, 10))
	}
	return l.resolve(ctx, msg, expect)
}
