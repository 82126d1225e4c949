package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func encodeEnvelope(env Envelope) ([]byte, error) {
	data, err := json.Marshal(env)
	if err != nil {
		return nil, fmt.Errorf("encode envelope %s: %w", env.ID, err)
	}
	return data, nil
}

// ReadOptions selects what Read delivers. The zero value reads every event from
// sequence 1 and waits for new ones until the context ends.
type ReadOptions struct {
	// FromSeq starts at this sequence (inclusive). Zero with Since unset starts
	// at the first event.
	FromSeq uint64
	// Since starts at the first event stored at or after this time.
	Since time.Time
	// New starts with the next event appended after the call.
	New bool
	// Filters restricts delivery to subjects matching any of these (wildcards
	// allowed); empty means every subject.
	Filters []string
	// StopAtEnd returns nil once every event stored when Read started has been
	// delivered, instead of waiting for more.
	StopAtEnd bool
	// IncludeUnknown delivers records of unknown types (Event nil) instead of
	// skipping them; they are counted either way.
	IncludeUnknown bool
}

// Read delivers events in log order to fn until ctx ends (returning nil), fn
// returns an error (returned), or, with StopAtEnd, the end is reached. It holds no
// durable state on the server: an ordered, ephemeral consumer.
func (l *Log) Read(ctx context.Context, opts ReadOptions, fn func(Record) error) error {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: opts.Filters}
	switch {
	case opts.New:
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	case !opts.Since.IsZero():
		cfg.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		since := opts.Since
		cfg.OptStartTime = &since
	case opts.FromSeq > 1:
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = opts.FromSeq
	default:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	if opts.StopAtEnd {
		remaining, err := l.pending(ctx, opts)
		if err != nil || remaining == 0 {
			return err
		}
	}
	return l.follow(ctx, "read", cfg, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) (bool, error) {
		rec, err := l.Decode(msg.Data(), meta.Sequence.Stream, msg.Subject())
		if err != nil {
			return false, err
		}
		if rec.Event != nil || opts.IncludeUnknown {
			if err := fn(rec); err != nil {
				return false, err
			}
		}
		return opts.StopAtEnd && meta.NumPending == 0, nil
	})
}

// follow runs an ordered consumer of cfg and hands each message to fn until
// ctx ends (nil), fn fails (its error) or fn says it is done (nil). what names
// the reader in errors.
func (l *Log) follow(ctx context.Context, what string, cfg jetstream.OrderedConsumerConfig,
	fn func(jetstream.Msg, *jetstream.MsgMetadata) (done bool, err error),
) error {
	if cfg.InactiveThreshold == 0 {
		cfg.InactiveThreshold = readerInactive
	}
	cons, err := l.js.OrderedConsumer(ctx, l.cfg.Name, cfg)
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, l.cfg.Name, classify(err))
	}
	// A stream holds a bounded number of consumers (1 000 by default), which
	// readers that come and go (a live stream's every resumption) must not
	// fill: the consumer goes with the read.
	defer l.deleteConsumer(cons)
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, l.cfg.Name, classify(err))
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) && ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("%s %s: %w", what, l.cfg.Name, classify(err))
		}
		meta, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("%s %s: %w", what, l.cfg.Name, err)
		}
		if done, err := fn(msg, meta); done || err != nil {
			return err
		}
	}
}

// readerInactive is how long the server keeps a reader's consumer that
// nobody reads, when its process died before deleting it.
const readerInactive = 30 * time.Second

// deleteConsumer removes a finished reader's consumer, bounded in time; one
// left behind goes after readerInactive.
func (l *Log) deleteConsumer(cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil || info.Name == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = l.js.DeleteConsumer(ctx, l.cfg.Name, info.Name)
}

// Decode turns a stored message body at seq on subject into a record; an
// unknown type is counted and comes back with a nil Event, an undecodable
// body is an error.
func (l *Log) Decode(data []byte, seq uint64, subject string) (Record, error) {
	env, ev, err := l.registry.Decode(data)
	if err != nil {
		if !errors.Is(err, ErrUnknownType) {
			return Record{}, fmt.Errorf("event at %d on %s: %w", seq, subject, err)
		}
		l.metrics.countUnknown()
	}
	return Record{Envelope: env, Seq: seq, Subject: subject, Event: ev}, nil
}

// pending counts the stored events Read would deliver, so StopAtEnd can return at
// once when there are none rather than wait for the first.
func (l *Log) pending(ctx context.Context, opts ReadOptions) (uint64, error) {
	if opts.New {
		return 0, nil
	}
	info, err := l.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream %s info: %w", l.cfg.Name, classify(err))
	}
	state := info.State
	if state.Msgs == 0 || opts.FromSeq > state.LastSeq {
		return 0, nil
	}
	if !opts.Since.IsZero() && state.LastTime.Before(opts.Since) {
		return 0, nil
	}
	// Filters may match nothing; an exact count per filter costs a subject scan, so
	// ask the server only when filtering.
	if len(opts.Filters) == 0 {
		return state.Msgs, nil
	}
	var n uint64
	for _, f := range opts.Filters {
		info, err := l.stream.Info(ctx, jetstream.WithSubjectFilter(f))
		if err != nil {
			return 0, fmt.Errorf("stream %s info for %s: %w", l.cfg.Name, f, classify(err))
		}
		for _, c := range info.State.Subjects {
			n += c
		}
	}
	return n, nil
}

// Touch is one event as Watch sees it: its position, subject and stored
// body, which Decode turns into the event when the subject is not enough.
type Touch struct {
	Seq     uint64
	Subject string
	Data    []byte
}

// Watch delivers the position, subject and body of every event appended after
// the sequence after, in log order, until ctx ends (returning nil) or fn
// returns an error (returned). It decodes nothing: it is for readers that
// mostly need to know what changed (such as a cache that drops what an event
// touches) and decode the few events they need whole.
func (l *Log) Watch(ctx context.Context, after uint64, fn func(Touch) error) error {
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
	if after > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = after + 1
	}
	return l.follow(ctx, "watch", cfg, func(msg jetstream.Msg, meta *jetstream.MsgMetadata) (bool, error) {
		return false, fn(Touch{Seq: meta.Sequence.Stream, Subject: msg.Subject(), Data: msg.Data()})
	})
}
