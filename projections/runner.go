package projections

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

// Projector builds one read model from the log.
type Projector interface {
	// Name is constant for the life of the deployment: it names the projector's
	// durable consumer, checkpoint, metrics and dead letters.
	Name() string
	// Checkpoint is the sequence of the last event applied (0: none).
	Checkpoint(ctx context.Context) (uint64, error)
	// Apply applies a batch in log order, exactly once in effect: events at or
	// below the checkpoint change nothing, and the checkpoint moves to the last
	// event atomically with the changes. Records with a nil Event (unknown or
	// dead-lettered) change nothing but the checkpoint. An error caused by one
	// event is an *EventError.
	Apply(ctx context.Context, batch []events.Record) error
}

// Pipeliner is a projector that can take a batch before the batch before it
// has been applied, so that its store applies the two back to back while the
// projector prepares the next: the runner sends each batch, then waits for
// the one before it.
type Pipeliner interface {
	// Send begins to apply batch, which follows the batch sent before it,
	// and returns at once; the outcome, as Apply's, arrives on the channel.
	// A batch takes effect after the one sent before it, and not at all if
	// that one failed. Send is called by one goroutine, with at most one
	// batch outstanding.
	Send(ctx context.Context, batch []events.Record) <-chan error
}

// Verifier is a projector that can check, while the log is quiet, that its
// state is still there (a store can lose it: a cache flushed, an empty
// replica promoted); an error makes the runner rewind to the checkpoint.
type Verifier interface {
	Verify(ctx context.Context) error
}

// Fenced is a projector that several processes may run, one of them at a
// time: its checkpoint writes carry the epoch of the lease its process holds
// (see package lease), and its store refuses a write under an epoch below
// the highest that wrote to it, with ErrFenced. So a process that lost the
// lease while a batch was under way cannot move the checkpoint after the
// new holder has.
type Fenced interface {
	// Fence sets the epoch of the writes to come; called before the runner
	// runs, never during.
	Fence(epoch uint64)
}

// ErrFenced is a checkpoint write refused because a newer lease holder has
// written (see Fenced).
var ErrFenced = errors.New("fenced: a newer holder of the projector's lease has written its checkpoint")

// BatchSizer is a projector that knows the batch size that suits it, for the
// runner to use when its config names none.
type BatchSizer interface {
	BatchSize() int
}

// EventError is a failure caused by one event rather than by the projector's
// store; an event that keeps failing is dead-lettered.
type EventError struct {
	Seq uint64
	Err error
}

func (e *EventError) Error() string { return fmt.Sprintf("event %d: %v", e.Seq, e.Err) }
func (e *EventError) Unwrap() error { return e.Err }

// RunnerConfig holds a runner's optional knobs; the zero value works.
type RunnerConfig struct {
	// BatchSize is the most events applied together; default the
	// projector's own (see BatchSizer), else 2000. Batches are as large as
	// the backlog allows, never waited for, so a large size costs live events
	// no latency and makes replays fast.
	BatchSize int
	// FetchWait is how long a fetch waits for events when caught up; default 1s.
	FetchWait time.Duration
	// MaxAttempts is how often one event may fail before it is dead-lettered;
	// default 3.
	MaxAttempts int
	// MaxBackoff caps the wait between attempts after a failure; default 5s.
	MaxBackoff time.Duration
}

func (c RunnerConfig) withDefaults() RunnerConfig {
	if c.BatchSize == 0 {
		c.BatchSize = 2000
	}
	if c.FetchWait == 0 {
		c.FetchWait = time.Second
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 3
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Second
	}
	return c
}

// ErrGap is a record that is not the next one expected from the log: those
// before it were lost on the way (with a connection or a node). A reader that
// meets one rewinds and reads again; it never applies past it.
var ErrGap = errors.New("gap in the log's delivery")

// errVerify marks a Verifier's failure.
var errVerify = errors.New("verify")

// RewindCause names why a reader rewound, for the rewinds metric.
func RewindCause(err error) string {
	var ee *EventError
	switch {
	case errors.Is(err, ErrGap):
		return "gap"
	case errors.Is(err, ErrFenced):
		return "fenced"
	case errors.As(err, &ee):
		return "event"
	case errors.Is(err, errVerify):
		return "verify"
	case errors.Is(err, domain.ErrUnavailable):
		return "unavailable"
	}
	return "store"
}

// DeadLetterStream holds the events projectors gave up on, with their errors,
// on subjects deadletter.<projector>.<seq>.
const DeadLetterStream = "FEED_DEADLETTER"

// ConsumerName is the durable consumer of a projector.
func ConsumerName(projector string) string { return "projector-" + projector }

// Runner feeds one projector from the log.
type Runner struct {
	log     *events.Log
	p       Projector
	cfg     RunnerConfig
	metrics *Metrics
	logger  *slog.Logger

	position atomic.Uint64
	running  atomic.Bool
	// attempts counts failures per event sequence; skip holds the events
	// dead-lettered by this process, applied as no-ops.
	attempts map[uint64]int
	skip     map[uint64]bool
	// deadLetters is set once the dead-letter stream is known to exist.
	deadLetters bool
}

// NewRunner returns a runner of p over log.
func NewRunner(log *events.Log, p Projector, cfg RunnerConfig, metrics *Metrics, logger *slog.Logger) *Runner {
	if s, ok := p.(BatchSizer); ok && cfg.BatchSize == 0 {
		cfg.BatchSize = s.BatchSize()
	}
	return &Runner{
		log:      log,
		p:        p,
		cfg:      cfg.withDefaults(),
		metrics:  metrics,
		logger:   logger.With("projector", p.Name()),
		attempts: map[uint64]int{},
		skip:     map[uint64]bool{},
	}
}

// Name is the projector's name.
func (r *Runner) Name() string { return r.p.Name() }

// Position is the last sequence this runner applied (or found checkpointed).
func (r *Runner) Position() uint64 { return r.position.Load() }

// Running reports whether the runner is consuming (for readiness).
func (r *Runner) Running() bool { return r.running.Load() }

// Run applies the log to the projector until ctx ends. Every failure rewinds to
// the checkpoint: the consumer is recreated at checkpoint+1, so no event is ever
// skipped by a later one overtaking it.
func (r *Runner) Run(ctx context.Context) error {
	defer r.running.Store(false)
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := r.consume(ctx)
		r.running.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		r.metrics.Rewound(r.p.Name(), RewindCause(err))
		r.logger.Warn("projector rewinds to its checkpoint", "err", err, "after", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil
		}
		backoff = min(backoff*2, r.cfg.MaxBackoff)
		if !errors.Is(err, domain.ErrUnavailable) {
			// An event failure is retried at once after the rewind; the wait
			// grows only while a dependency stays down.
			backoff = 50 * time.Millisecond
		}
	}
	return nil
}

// consume runs from the checkpoint until an error.
func (r *Runner) consume(ctx context.Context) error {
	if !r.deadLetters {
		if err := r.ensureDeadLetterStream(ctx); err != nil {
			return err
		}
		r.deadLetters = true
	}
	cp, err := r.p.Checkpoint(ctx)
	if err != nil {
		return fmt.Errorf("read checkpoint: %w", err)
	}
	r.position.Store(cp)
	r.metrics.position(r.p.Name(), cp)
	cons, holes, err := r.consumerAt(ctx, cp+1)
	if err != nil {
		return err
	}
	r.running.Store(true)

	// The next batch is fetched and decoded while this one is applied, and
	// topped up with what arrived meanwhile when it is wanted.
	fetchCtx, stopFetching := context.WithCancel(ctx)
	batches := make(chan fetched)
	want := make(chan struct{})
	var fetching sync.WaitGroup
	fetching.Go(func() { r.fetch(fetchCtx, cons, &order{next: cp + 1, holes: holes}, want, batches) })
	// The fetcher stops at its next step (a fetch waits at most FetchWait) and
	// is waited for, so no read of the log outlives this call.
	defer fetching.Wait()
	defer stopFetching()

	// With a Pipeliner, the batch sent last is outstanding until the next is
	// sent or none comes; a batch that started is finished even when
	// shutdown begins meanwhile, or when what comes after it fails: the
	// runner waits for it rather than throw the work away.
	pl, _ := r.p.(Pipeliner)
	var out *outstanding
	defer func() {
		if out != nil {
			r.settleVoid(out)
		}
	}()
	for ctx.Err() == nil {
		// The next batch is asked for, then taken. The outstanding batch is
		// settled as soon as it is applied, not when the next batch comes:
		// readers wait on the position.
		var f fetched
		for asked, received := false, false; !received; {
			ask, take := want, batches
			if asked {
				ask = nil
			} else {
				take = nil
			}
			var applied <-chan error
			if out != nil {
				applied = out.result
			}
			select {
			case ask <- struct{}{}:
				asked = true
			case f = <-take:
				received = true
			case err := <-applied:
				o := out
				out = nil
				if err := r.settle(ctx, o, err); err != nil {
					return err
				}
			case <-ctx.Done():
				return nil
			}
		}
		if f.err != nil {
			return f.err
		}
		if f.idle {
			if o := out; o != nil {
				out = nil
				if err := r.settle(ctx, o, <-o.result); err != nil {
					return err
				}
			}
			if v, ok := r.p.(Verifier); ok {
				if err := v.Verify(ctx); err != nil {
					return fmt.Errorf("%w: %w", errVerify, err)
				}
			}
			continue
		}
		r.metrics.lag(r.p.Name(), f.pending)
		records := f.records[:0]
		for _, rec := range f.records {
			if rec.Seq <= cp {
				continue
			}
			if bad, ok := f.undecodable[rec.Seq]; ok && !r.skip[rec.Seq] {
				// A body that is not an envelope at all is a poison event too.
				r.deadLetter(ctx, rec, bad.body, bad.err)
			}
			if r.skip[rec.Seq] {
				rec.Event = nil
			}
			records = append(records, rec)
		}
		if len(records) == 0 {
			continue
		}
		cp = records[len(records)-1].Seq
		sent := &outstanding{records: records, start: time.Now()}
		if pl == nil {
			// A batch that started is finished even when shutdown begins
			// meanwhile.
			if err := r.p.Apply(context.WithoutCancel(ctx), records); err != nil {
				return r.settle(ctx, sent, err)
			}
			_ = r.settle(ctx, sent, nil)
			continue
		}
		sent.result = pl.Send(context.WithoutCancel(ctx), records)
		prev := out
		out = sent
		if prev != nil {
			if err := r.settle(ctx, prev, <-prev.result); err != nil {
				return err
			}
		}
	}
	return nil
}

// outstanding is a batch handed to the projector and not yet settled.
type outstanding struct {
	records []events.Record
	start   time.Time
	result  <-chan error // a Pipeliner's outcome
}

// settle takes the outcome of batch o: the position and metrics when it was
// applied, the failure counted against it when not.
func (r *Runner) settle(ctx context.Context, o *outstanding, err error) error {
	first, last := o.records[0].Seq, o.records[len(o.records)-1].Seq
	if err != nil {
		r.failed(ctx, o.records, err)
		return fmt.Errorf("apply %d..%d: %w", first, last, err)
	}
	r.position.Store(last)
	r.metrics.applied(r.p.Name(), len(o.records), last, time.Since(o.start))
	r.metrics.delayed(r.p.Name(), o.records)
	return nil
}

// settleVoid waits for batch o after a failure or at shutdown: applied, it
// still moves the position; failed, it counts against none of its events
// (it follows a failure, or the runner is stopping), and the next start
// applies it again.
func (r *Runner) settleVoid(o *outstanding) {
	if err := <-o.result; err == nil {
		r.position.Store(o.records[len(o.records)-1].Seq)
	}
}

// order is what the fetcher expects next from the log.
type order struct {
	next  uint64
	holes holes
}

// take checks that seq may follow what was taken before: it is next, or the
// stream reports every sequence between gone. A sequence taken already is
// not taken again (false).
func (o *order) take(seq uint64) (bool, error) {
	if seq < o.next {
		return false, nil
	}
	skipped := seq - o.next
	for s := o.next; s < seq; s++ {
		if !o.holes.gone(s) {
			return false, fmt.Errorf("%w: sequence %d came where %d was expected", ErrGap, seq, s)
		}
	}
	o.next = seq + 1
	if skipped > 0 {
		return true, &knownGap{from: seq - skipped, to: seq - 1}
	}
	return true, nil
}

// lostTail fails with ErrGap when the consumer has delivered events the
// fetcher never took: lost on the way with nothing after them yet, they would
// leave no gap for order to see until the next event came.
func lostTail(ctx context.Context, cons jetstream.Consumer, o *order) error {
	info, err := cons.Info(ctx)
	if err != nil {
		return fmt.Errorf("consumer info: %w", classifyNATS(err))
	}
	if last := info.Delivered.Stream; last >= o.next && !o.holes.gone(last) {
		return fmt.Errorf("%w: the consumer delivered up to %d, the fetcher took up to %d", ErrGap, last, o.next-1)
	}
	return nil
}

// knownGap is a run of sequences the stream reports gone, passed over.
type knownGap struct{ from, to uint64 }

func (g *knownGap) Error() string {
	return fmt.Sprintf("sequences %d..%d are not in the stream", g.from, g.to)
}

// holes are the sequences a stream reports it no longer has: below its first
// sequence, or deleted. The events stream denies deletes and keeps every
// event, so it has none; a stream with limits or deletes is read across them
// as it reports them, never by guessing from what a fetch skipped.
type holes struct {
	first   uint64
	deleted map[uint64]bool
}

func (h holes) gone(seq uint64) bool { return seq < h.first || h.deleted[seq] }

// pull fetches up to n events into f: those already available when wait is 0,
// else waiting up to wait for them. Events must come in order, each the next
// of the log (see order).
func (r *Runner) pull(cons jetstream.Consumer, o *order, n int, wait time.Duration, f *fetched) error {
	var (
		batch jetstream.MessageBatch
		err   error
	)
	if wait == 0 {
		batch, err = cons.FetchNoWait(n)
	} else {
		batch, err = cons.Fetch(n, jetstream.FetchMaxWait(wait))
	}
	if err != nil {
		return fmt.Errorf("fetch: %w", classifyNATS(err))
	}
	for msg := range batch.Messages() {
		meta, err := msg.Metadata()
		if err != nil {
			return fmt.Errorf("message metadata: %w", err)
		}
		f.pending = meta.NumPending
		take, err := o.take(meta.Sequence.Stream)
		if gap := (*knownGap)(nil); errors.As(err, &gap) {
			r.metrics.knownGap(r.p.Name(), gap.to-gap.from+1)
			r.logger.Warn("projector passes over sequences the stream no longer has", "from", gap.from, "to", gap.to)
		} else if err != nil {
			return err
		}
		if !take {
			continue
		}
		if f.records == nil {
			// Sized once for what is there (a replay's batches are full, a
			// live one's are small): a batch's records are most of what a
			// fetch allocates.
			f.records = make([]events.Record, 0, min(r.cfg.BatchSize, 1+int(meta.NumPending)))
		}
		rec, err := r.log.Decode(msg.Data(), meta.Sequence.Stream, msg.Subject())
		if err != nil {
			rec = events.Record{Seq: meta.Sequence.Stream, Subject: msg.Subject()}
			rec.Type = "undecodable"
			if f.undecodable == nil {
				f.undecodable = map[uint64]undecodable{}
			}
			f.undecodable[rec.Seq] = undecodable{msg.Data(), err}
		}
		f.records = append(f.records, rec)
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
		return fmt.Errorf("fetch: %w", classifyNATS(err))
	}
	return nil
}

// fetched is one batch as read from the consumer.
type fetched struct {
	records []events.Record
	// undecodable holds, by sequence, the records whose body is not an
	// envelope (their Event is nil).
	undecodable map[uint64]undecodable
	pending     uint64
	err         error
	// idle marks a wait that ended with no event: the projector is caught up.
	idle bool
}

// undecodable is a body that is not an envelope, and why.
type undecodable struct {
	body []byte
	err  error
}

// fetchMargin is how many more events than the server last had left a fetch
// asks for, for those appended since.
const fetchMargin = 256

// fetch reads batches in order and hands them over until ctx ends or a fetch
// fails (the failure is handed over too, and ends the loop).
func (r *Runner) fetch(ctx context.Context, cons jetstream.Consumer, o *order, want <-chan struct{}, out chan<- fetched) {
	send := func(f fetched) bool {
		select {
		case out <- f:
			return true
		case <-ctx.Done():
			return false
		}
	}
	// left is how many events the server had left after the last one fetched
	// (-1: not known yet). A fetch that takes what is there asks for no more
	// than that and a margin: the client allocates buffers for as many
	// messages as asked (24 bytes each, 190 KiB for the read model's 8 000),
	// and a live projector fetches dozens of times a second.
	left := -1
	size := func(room int) int {
		if left < 0 {
			return room
		}
		return min(room, left+fetchMargin)
	}
	pull := func(n int, wait time.Duration, f *fetched) error {
		had := len(f.records)
		err := r.pull(cons, o, n, wait, f)
		if len(f.records) > had {
			left = int(min(f.pending, uint64(r.cfg.BatchSize)))
		}
		return err
	}
	for ctx.Err() == nil {
		var f fetched
		// Take what is there without waiting; when caught up, wait for the next
		// event alone and then sweep up whatever came with it. A full-size fetch
		// would instead hold a trickle of live events until the batch filled.
		err := pull(size(r.cfg.BatchSize), 0, &f)
		if err == nil && len(f.records) == 0 {
			err = pull(1, r.cfg.FetchWait, &f)
			if err == nil && len(f.records) > 0 && r.cfg.BatchSize > 1 {
				err = pull(size(r.cfg.BatchSize-1), 0, &f)
			}
			if err == nil && len(f.records) == 0 {
				err = lostTail(ctx, cons, o)
			}
		}
		// A batch fetched ahead is handed over when wanted (and so is a
		// failure), with what arrived while the batch before it was applied:
		// handed over as fetched, those live events would wait for the batch
		// after, a whole apply longer. A replay's batches are full already.
		select {
		case <-want:
		case <-ctx.Done():
			return
		}
		if n := len(f.records); err == nil && n > 0 && n < r.cfg.BatchSize {
			err = pull(size(r.cfg.BatchSize-n), 0, &f)
		}
		if err != nil {
			send(fetched{err: err})
			return
		}
		f.idle = len(f.records) == 0
		if !send(f) {
			return
		}
	}
}

// failed counts a failure against the event that caused it and dead-letters
// that event once it has failed MaxAttempts times.
func (r *Runner) failed(ctx context.Context, batch []events.Record, err error) {
	var ee *EventError
	if !errors.As(err, &ee) {
		r.metrics.failure(r.p.Name(), "store")
		return
	}
	r.metrics.failure(r.p.Name(), "event")
	r.attempts[ee.Seq]++
	if r.attempts[ee.Seq] < r.cfg.MaxAttempts {
		return
	}
	for _, rec := range batch {
		if rec.Seq == ee.Seq {
			data, _ := json.Marshal(rec.Envelope)
			r.deadLetter(ctx, rec, data, ee.Err)
			return
		}
	}
}

// deadLetter records an event the projector gives up on, with its error, and
// makes the projector apply it as a no-op from now on.
func (r *Runner) deadLetter(ctx context.Context, rec events.Record, data []byte, cause error) {
	r.skip[rec.Seq] = true
	delete(r.attempts, rec.Seq)
	r.metrics.deadLettered(r.p.Name())
	r.logger.Error("event dead-lettered", "seq", rec.Seq, "subject", rec.Subject, "type", rec.Type, "err", cause)
	body, _ := json.Marshal(struct {
		Projector string          `json:"projector"`
		Seq       uint64          `json:"seq"`
		Subject   string          `json:"subject"`
		Type      string          `json:"type"`
		Error     string          `json:"error"`
		Event     json.RawMessage `json:"event"`
	}{r.p.Name(), rec.Seq, rec.Subject, rec.Type, cause.Error(), jsonOrString(data)})
	msg := nats.NewMsg(fmt.Sprintf("deadletter.%s.%d", r.p.Name(), rec.Seq))
	msg.Data = body
	msg.Header.Set(jetstream.MsgIDHeader, r.p.Name()+"-"+strconv.FormatUint(rec.Seq, 10))
	if _, err := r.log.JetStream().PublishMsg(ctx, msg); err != nil {
		// The count and the log line above still tell the operator.
		r.logger.Error("store dead letter", "seq", rec.Seq, "err", err)
	}
}

func jsonOrString(data []byte) json.RawMessage {
	if json.Valid(data) {
		return data
	}
	s, _ := json.Marshal(string(data))
	return s
}

func (r *Runner) ensureDeadLetterStream(ctx context.Context) error {
	_, err := r.log.JetStream().CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        DeadLetterStream,
		Description: "Events projectors gave up on, with the error (see the README).",
		Subjects:    []string{"deadletter.>"},
		Storage:     jetstream.FileStorage,
		Replicas:    r.log.Replicas(),
		Duplicates:  time.Hour,
	})
	if err != nil {
		return fmt.Errorf("dead-letter stream: %w", classifyNATS(err))
	}
	return nil
}

// consumerAt (re)creates the projector's durable consumer so that it delivers
// from seq on, and returns the holes the stream reports from there. The
// checkpoint, not the consumer's own state, is the truth: recreating it is
// how a projector rewinds. So the consumer keeps no state worth the server's
// work: no acks (nothing is redelivered; what is lost on the way shows as a
// gap, see order), its state in memory, and no filter (the stream holds only
// events; a filter costs a subject match per event).
func (r *Runner) consumerAt(ctx context.Context, seq uint64) (jetstream.Consumer, holes, error) {
	js, stream, name := r.log.JetStream(), r.log.Stream(), ConsumerName(r.p.Name())
	h, err := streamHoles(ctx, js, stream, seq)
	if err != nil {
		return nil, h, err
	}
	if err := js.DeleteConsumer(ctx, stream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, h, fmt.Errorf("reset consumer %s: %w", name, classifyNATS(err))
	}
	cons, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable:       name,
		Description:   "Projector " + r.p.Name() + "; recreated at its checkpoint+1 on every start and failure.",
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   seq,
		AckPolicy:     jetstream.AckNonePolicy,
		MemoryStorage: true,
	})
	if err != nil {
		return nil, h, fmt.Errorf("create consumer %s at %d: %w", name, seq, classifyNATS(err))
	}
	return cons, h, nil
}

// streamHoles reads the holes of stream at and after seq from its state.
func streamHoles(ctx context.Context, js jetstream.JetStream, name string, seq uint64) (holes, error) {
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return holes{}, fmt.Errorf("stream %s: %w", name, classifyNATS(err))
	}
	state := stream.CachedInfo().State
	h := holes{first: state.FirstSeq}
	if state.NumDeleted == 0 {
		return h, nil
	}
	info, err := stream.Info(ctx, jetstream.WithDeletedDetails(true))
	if err != nil {
		return holes{}, fmt.Errorf("stream %s: %w", name, classifyNATS(err))
	}
	h = holes{first: info.State.FirstSeq, deleted: map[uint64]bool{}}
	for _, d := range info.State.Deleted {
		if d >= seq {
			h.deleted[d] = true
		}
	}
	return h, nil
}

// classifyNATS marks connection-level failures as domain.ErrUnavailable.
func classifyNATS(err error) error {
	switch {
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrNoResponders), errors.Is(err, nats.ErrTimeout),
		errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrReconnectBufExceeded), errors.Is(err, jetstream.ErrNoHeartbeat):
		return fmt.Errorf("%w: %w", domain.ErrUnavailable, err)
	}
	return err
}
