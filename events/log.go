package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
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
	// Replicas is the JetStream replication factor (3 in a cluster). 0 keeps
	// an existing stream's and creates a new one with 1; a count that differs
	// from the stream's is applied (see OpenLog).
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
	// ResolveTimeout bounds how long an append whose outcome was lost (a
	// timeout, a connection or a leader lost) is looked for in the log
	// before it fails with domain.ErrOutcomeUnknown; default 10s.
	ResolveTimeout time.Duration
	// Logger hears of changes OpenLog makes to an existing stream and of
	// retries while the stream cannot be reached; default none.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = "FEED_EVENTS"
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
	if c.ResolveTimeout == 0 {
		c.ResolveTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
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

// OpenLog is the service's own start: it creates the stream, or updates it
// to the desired configuration, logging what it changes. A replica count
// given in cfg is applied (0 keeps the stream's). While the stream cannot be
// reached (no quorum, a timeout) it retries with backoff until ctx ends. It
// is safe to call at every start, from any number of service processes;
// tools use AttachLog, which changes nothing.
func OpenLog(ctx context.Context, js jetstream.JetStream, cfg Config, metrics *Metrics) (*Log, error) {
	cfg = cfg.withDefaults()
	var stream jetstream.Stream
	err := RetryUnavailable(ctx, cfg.Logger, "open stream "+cfg.Name, func() error {
		var err error
		stream, err = ensureStream(ctx, js, cfg)
		return err
	})
	if err != nil {
		return nil, err
	}
	cfg.Replicas = stream.CachedInfo().Config.Replicas
	return newLog(js, stream, cfg, metrics), nil
}

// AttachLog opens the existing stream as it is configured, for tools that
// read or replay the log: it never creates or changes a stream, and fails
// with domain.ErrNotFound when there is none.
func AttachLog(ctx context.Context, js jetstream.JetStream, cfg Config, metrics *Metrics) (*Log, error) {
	cfg = cfg.withDefaults()
	stream, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("stream %s does not exist (the service creates it when it starts): %w", cfg.Name, domain.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Name, classify(err))
	}
	cfg.Replicas = stream.CachedInfo().Config.Replicas
	cfg.DedupWindow = stream.CachedInfo().Config.Duplicates
	return newLog(js, stream, cfg, metrics), nil
}

func newLog(js jetstream.JetStream, stream jetstream.Stream, cfg Config, metrics *Metrics) *Log {
	l := &Log{js: js, stream: stream, cfg: cfg, registry: NewRegistry(), metrics: metrics}
	l.commit = startCommitter(js, cfg.MaxBatch, cfg.AtomicFrom, metrics)
	return l
}

// ensureStream creates the stream of cfg or brings an existing one to it.
func ensureStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	want := cfg.jetstreamConfig()
	stream, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		want.Replicas = max(cfg.Replicas, 1)
		stream, err = js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return ensureStream(ctx, js, cfg) // another process created it first
		}
		if err != nil {
			return nil, fmt.Errorf("create stream %s: %w", cfg.Name, classify(err))
		}
		cfg.Logger.Info("stream created", "stream", cfg.Name, "replicas", want.Replicas)
		return stream, nil
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Name, classify(err))
	}
	have := stream.CachedInfo().Config
	if want.Replicas == 0 {
		want.Replicas = have.Replicas
	}
	changes := StreamChanges(have, want)
	if len(changes) == 0 {
		return stream, nil
	}
	if stream, err = js.UpdateStream(ctx, want); err != nil {
		return nil, fmt.Errorf("update stream %s (%s): %w", cfg.Name, strings.Join(changes, ", "), classify(err))
	}
	cfg.Logger.Warn("stream configuration changed", "stream", cfg.Name, "changes", strings.Join(changes, ", "))
	return stream, nil
}

// StreamChanges lists, as "field: old -> new", what the service sets in a
// stream's configuration and want changes from have.
func StreamChanges(have, want jetstream.StreamConfig) []string {
	var out []string
	diff := func(field string, a, b any) {
		if fmt.Sprint(a) != fmt.Sprint(b) {
			out = append(out, fmt.Sprintf("%s: %v -> %v", field, a, b))
		}
	}
	diff("replicas", have.Replicas, want.Replicas)
	diff("description", have.Description, want.Description)
	diff("subjects", have.Subjects, want.Subjects)
	diff("retention", have.Retention, want.Retention)
	diff("storage", have.Storage, want.Storage)
	diff("duplicates", have.Duplicates, want.Duplicates)
	diff("discard", have.Discard, want.Discard)
	diff("allow_direct", have.AllowDirect, want.AllowDirect)
	diff("allow_atomic", have.AllowAtomicPublish, want.AllowAtomicPublish)
	diff("deny_delete", have.DenyDelete, want.DenyDelete)
	diff("deny_purge", have.DenyPurge, want.DenyPurge)
	return out
}

// RetryUnavailable runs op until it succeeds, fails for a reason other than
// JetStream being unreachable (see Classify), or ctx ends, waiting longer
// after each failure: how a start waits out a cluster without quorum.
func RetryUnavailable(ctx context.Context, logger *slog.Logger, what string, op func() error) error {
	backoff := 100 * time.Millisecond
	for {
		err := op()
		if err == nil || !errors.Is(err, domain.ErrUnavailable) {
			return err
		}
		logger.Warn(what+" failed; retrying", "err", err, "after", backoff)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last error: %w)", what, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// Replicas is the stream's replication factor, for the streams derived from
// the log, which are replicated as it is.
func (l *Log) Replicas() int { return max(l.cfg.Replicas, 1) }

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
	if err != nil && unknownOutcome(err) {
		res, err = l.resolve(ctx, msg, o.expectSubjectSeq)
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
// Any replica may answer, one that lags included; none is found only when the
// stream's leader finds none.
func (l *Log) Last(ctx context.Context, filter string) (Record, error) {
	raw, err := l.stream.GetLastMsgForSubject(ctx, filter)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		raw, err = l.leaderGet(ctx, msgGetRequest{LastFor: filter})
	}
	return l.lastRecord(filter, raw, err)
}

// LeaderLast is Last as the stream's leader answers it: never older than an
// acknowledged event.
func (l *Log) LeaderLast(ctx context.Context, filter string) (Record, error) {
	raw, err := l.leaderGet(ctx, msgGetRequest{LastFor: filter})
	return l.lastRecord(filter, raw, err)
}

func (l *Log) lastRecord(filter string, raw *jetstream.RawStreamMsg, err error) (Record, error) {
	if err != nil {
		if errors.Is(err, domain.ErrNotFound) {
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

// Get returns the event at seq, or an error wrapping domain.ErrNotFound. Any
// replica may answer; an event is not found only when the stream's leader
// does not have it.
func (l *Log) Get(ctx context.Context, seq uint64) (Record, error) {
	raw, err := l.stream.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		raw, err = l.leaderGet(ctx, msgGetRequest{Seq: seq})
	}
	if err != nil {
		if errors.Is(err, domain.ErrNotFound) {
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

// Classify marks JetStream errors as classify does, for the other streams'
// owners.
func Classify(err error) error { return classify(err) }

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
