package events

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/domain"
)

// Config configures the event stream. The zero value works.
type Config struct {
	// Name of the stream; default "FEED_EVENTS". Persisted: renaming it starts an
	// empty log.
	Name string
	// Replicas is the JetStream replication factor; default 1, 3 in a cluster.
	Replicas int
	// DedupWindow is how long a Nats-Msg-Id is remembered, and so how long a
	// client may retry a command with the same Idempotency-Key; default 10m.
	DedupWindow time.Duration
	// MaxBatch is the most unconditional appends committed together (group
	// commit); 1 commits each alone; default 256.
	MaxBatch int
	// AtomicFrom is the size from which appends committed together go as one
	// atomic batch, which the server writes and syncs once; smaller groups are
	// published pipelined, each synced on its own. Default 16 (see
	// defaultAtomicFrom).
	AtomicFrom int
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = "FEED_EVENTS"
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.DedupWindow == 0 {
		c.DedupWindow = 10 * time.Minute
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = 256
	}
	if c.AtomicFrom == 0 {
		c.AtomicFrom = defaultAtomicFrom
	}
	return c
}

// jetstreamConfig is the desired stream. It keeps every event for ever (the log is
// the system of record and projectors replay it from sequence 1), on file storage.
func (c Config) jetstreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        c.Name,
		Description: "News feed domain events; the system of record (see docs/events.md).",
		Subjects:    []string{AllSubjects},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    c.Replicas,
		Duplicates:  c.DedupWindow,
		Discard:     jetstream.DiscardOld,
		// Direct gets serve the per-post owner lookups of commands from any replica.
		AllowDirect: true,
		// Atomic batches let concurrent commands share one commit (group commit).
		AllowAtomicPublish: true,
		DenyDelete:         true,
		DenyPurge:          true,
	}
}

// Log appends events to the stream and reads them back.
type Log struct {
	js       jetstream.JetStream
	stream   jetstream.Stream
	cfg      Config
	registry *Registry
	metrics  *Metrics
	commit   *committer
}

// OpenLog creates the stream or updates it to the desired configuration; it is
// safe to call at every start, from any number of processes.
func OpenLog(ctx context.Context, js jetstream.JetStream, cfg Config, metrics *Metrics) (*Log, error) {
	cfg = cfg.withDefaults()
	stream, err := js.CreateOrUpdateStream(ctx, cfg.jetstreamConfig())
	if err != nil {
		return nil, fmt.Errorf("create or update stream %s: %w", cfg.Name, classify(err))
	}
	l := &Log{js: js, stream: stream, cfg: cfg, registry: NewRegistry(), metrics: metrics}
	l.commit = startCommitter(js, cfg.MaxBatch, cfg.AtomicFrom, metrics)
	return l, nil
}

// Close stops group commit once the appends under way are answered; later
// appends fail as unavailable. It does not close the NATS connection.
func (l *Log) Close() { l.commit.close() }

// Stream returns the stream name.
func (l *Log) Stream() string { return l.cfg.Name }

// Registry returns the registry the log decodes with.
func (l *Log) Registry() *Registry { return l.registry }

// JetStream returns the underlying JetStream context, for readers that need
// consumers of their own (projectors).
func (l *Log) JetStream() jetstream.JetStream { return l.js }

// AppendOption makes an append conditional.
type AppendOption func(*appendOptions)

type appendOptions struct {
	expectSubjectSeq *uint64
}

// ExpectSubjectSeq makes the append fail with domain.ErrConflict unless the last
// event on the event's subject is at seq (0: the subject has no event yet). This
// is optimistic concurrency per aggregate.
func ExpectSubjectSeq(seq uint64) AppendOption {
	return func(o *appendOptions) { o.expectSubjectSeq = &seq }
}

// Appended is the outcome of an append.
type Appended struct {
	// Seq is the event's position in the log.
	Seq uint64
	// Duplicate is true when an event with the same id was already in the log
	// within the dedup window: nothing new was stored and Seq is the first one's.
	Duplicate bool
}

// Append stores one event under its envelope id and returns its position once the
// server has acknowledged it as stored.
func (l *Log) Append(ctx context.Context, env Envelope, subject string, opts ...AppendOption) (Appended, error) {
	var o appendOptions
	for _, opt := range opts {
		opt(&o)
	}
	msg, err := l.message(env, subject)
	if err != nil {
		return Appended{}, err
	}
	start := time.Now()
	var res Appended
	if o.expectSubjectSeq != nil {
		// A conditional append goes alone: in a batch, its failed expectation
		// would fail every other append with it.
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(*o.expectSubjectSeq, 10))
		res, err = publishOne(ctx, l.js, msg)
	} else {
		res, err = l.commit.append(ctx, msg)
	}
	l.metrics.observeAppend(env.Type, start, err)
	if err != nil {
		return Appended{}, fmt.Errorf("append %s %s: %w", env.Type, env.ID, classify(err))
	}
	return res, nil
}

// AppendEvent wraps ev in an envelope and appends it to its own subject.
func (l *Log) AppendEvent(ctx context.Context, id string, at time.Time, ev Event, opts ...AppendOption) (Appended, error) {
	env, err := NewEnvelope(id, at, ev)
	if err != nil {
		return Appended{}, err
	}
	return l.Append(ctx, env, ev.Subject(), opts...)
}

func (l *Log) message(env Envelope, subject string) (*nats.Msg, error) {
	data, err := encodeEnvelope(env)
	if err != nil {
		return nil, err
	}
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set(jetstream.MsgIDHeader, env.ID)
	// The type in a header lets tools filter without parsing bodies.
	msg.Header.Set(TypeHeader, env.Type)
	return msg, nil
}

// TypeHeader carries the envelope's event type on every stored message.
const TypeHeader = "Feed-Event-Type"

// Head returns the sequence of the newest event, 0 for an empty log.
func (l *Log) Head(ctx context.Context) (uint64, error) {
	info, err := l.stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("stream %s info: %w", l.cfg.Name, classify(err))
	}
	return info.State.LastSeq, nil
}

// Last returns the newest event whose subject matches filter (wildcards allowed),
// or an error wrapping domain.ErrNotFound. Unknown types come back with a nil Event.
func (l *Log) Last(ctx context.Context, filter string) (Record, error) {
	raw, err := l.stream.GetLastMsgForSubject(ctx, filter)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return Record{}, fmt.Errorf("last event on %s: %w", filter, domain.ErrNotFound)
		}
		return Record{}, fmt.Errorf("last event on %s: %w", filter, classify(err))
	}
	env, ev, err := l.registry.Decode(raw.Data)
	if err != nil && !errors.Is(err, ErrUnknownType) {
		return Record{}, fmt.Errorf("last event on %s: %w", filter, err)
	}
	return Record{Envelope: env, Seq: raw.Sequence, Subject: raw.Subject, Event: ev}, nil
}

// Get returns the event at seq, or an error wrapping domain.ErrNotFound.
func (l *Log) Get(ctx context.Context, seq uint64) (Record, error) {
	raw, err := l.stream.GetMsg(ctx, seq)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return Record{}, fmt.Errorf("event %d: %w", seq, domain.ErrNotFound)
		}
		return Record{}, fmt.Errorf("event %d: %w", seq, classify(err))
	}
	return l.Decode(raw.Data, raw.Sequence, raw.Subject)
}

// Position formats a log sequence as the opaque position clients see.
func Position(seq uint64) string { return strconv.FormatUint(seq, 10) }

// ParsePosition parses a position a client sent back.
func ParsePosition(s string) (uint64, error) {
	seq, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("position %q: %w", s, domain.ErrInvalid)
	}
	return seq, nil
}

// classify marks errors that mean the log cannot be reached as
// domain.ErrUnavailable and failed expectations as domain.ErrConflict, keeping
// the original in the chain.
func classify(err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		return fmt.Errorf("%w: %w", domain.ErrConflict, err)
	case errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrConnectionClosed),
		errors.Is(err, nats.ErrConnectionDraining),
		errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrReconnectBufExceeded),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w: %w", domain.ErrUnavailable, err)
	}
	return err
}
