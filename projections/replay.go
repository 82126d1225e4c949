package projections

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

// Shadow is a projector's state being rebuilt beside the live one, which keeps
// serving until the shadow replaces it.
type Shadow interface {
	// Projector applies to the shadow; its Checkpoint is the shadow's, so a
	// rebuild that was interrupted resumes where it stopped.
	Projector
	// Switch makes the shadow the live state, atomically for readers. Once the
	// live projector can no longer advance, it calls catchUp with the live
	// position, and swaps when the shadow has applied up to it.
	Switch(ctx context.Context, catchUp func(ctx context.Context, to uint64) error) error
	// Cleanup removes the replaced state; it is safe to call again.
	Cleanup(ctx context.Context) error
}

// ErrRebuildRunning is returned when another rebuild of the same projector
// holds its lock.
var ErrRebuildRunning = fmt.Errorf("another rebuild of this projector is running: %w", domain.ErrConflict)

// Phases of a rebuild, in order.
const (
	PhaseReplaying = "replaying"
	PhaseSwitching = "switching"
	PhaseCleaning  = "cleaning"
	PhaseDone      = "done"
)

// Progress is where a rebuild stands.
type Progress struct {
	Projector string `json:"projector"`
	Phase     string `json:"phase"`
	// Position is the shadow's checkpoint; Head the log's last sequence as last
	// seen; From the first sequence the shadow applied.
	Position uint64 `json:"position,string"`
	Head     uint64 `json:"head,string"`
	From     uint64 `json:"from,string"`
	// Done of Total events are applied (counting those applied before an
	// interruption).
	Done  uint64 `json:"done"`
	Total uint64 `json:"total"`
	// Rate is events per second in this run; ETA the time left at that rate.
	Rate    float64       `json:"rate"`
	ETA     time.Duration `json:"eta_ns"`
	Skipped int           `json:"skipped"`
	Started time.Time     `json:"started"`
}

// ReplayOptions tunes Replay.
type ReplayOptions struct {
	// FromSeq or Since choose where a new shadow starts (default: the first
	// event). Events before it are not applied: this is for logs that no longer
	// hold them. A resumed shadow continues after its checkpoint.
	FromSeq uint64
	Since   time.Time
	// BatchSize is the number of events per apply (default the shadow's own,
	// see BatchSizer, else 1000).
	BatchSize int
	// SwitchLag is how close to the head the shadow must be before the switch,
	// during which the live projector waits for the rest (default 1000).
	SwitchLag uint64
	// Progress, if set, is called after each batch and at each phase.
	Progress func(Progress)
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (o ReplayOptions) withDefaults() ReplayOptions {
	if o.BatchSize <= 0 {
		o.BatchSize = 1000
	}
	if o.SwitchLag == 0 {
		o.SwitchLag = 1000
	}
	if o.Progress == nil {
		o.Progress = func(Progress) {}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Replay rebuilds a projector into shadow from the log, switches the live
// state to it and removes the old one. Interrupted (ctx ends, the process
// dies), it leaves the shadow to be resumed by the next Replay.
func Replay(ctx context.Context, log *events.Log, shadow Shadow, opts ReplayOptions) error {
	if s, ok := shadow.(BatchSizer); ok && opts.BatchSize <= 0 {
		opts.BatchSize = s.BatchSize()
	}
	opts = opts.withDefaults()
	r := &replay{log: log, shadow: shadow, opts: opts}
	r.progress = Progress{Projector: shadow.Name(), Phase: PhaseReplaying, Started: opts.Now()}
	cp, err := shadow.Checkpoint(ctx)
	if err != nil {
		return err
	}
	r.progress.Position = cp
	r.progress.From = cp + 1
	read := events.ReadOptions{FromSeq: cp + 1}
	if cp == 0 {
		read = events.ReadOptions{FromSeq: max(opts.FromSeq, 1), Since: opts.Since}
		r.progress.From = read.FromSeq
	}
	// Catch up with the head, again and again while the log grows, until the
	// rest is short enough to apply while the live projector waits.
	for pass := 0; ; pass++ {
		head, err := log.Head(ctx)
		if err != nil {
			return err
		}
		r.setHead(head)
		if pass == 0 {
			opts.Progress(r.progress) // where it starts: 0, or where it resumes
		}
		if pass > 0 && head <= r.progress.Position+opts.SwitchLag {
			break
		}
		before := r.progress.Position
		if err := r.apply(ctx, read, head); err != nil {
			return err
		}
		if pass > 0 && r.progress.Position == before {
			break // nothing more to read
		}
		if r.progress.Position > 0 {
			read = events.ReadOptions{FromSeq: r.progress.Position + 1}
		}
	}

	r.phase(PhaseSwitching)
	err = shadow.Switch(ctx, func(ctx context.Context, to uint64) error {
		if to > r.progress.Position {
			if r.progress.Position > 0 {
				read = events.ReadOptions{FromSeq: r.progress.Position + 1}
			}
			if err := r.apply(ctx, read, to); err != nil {
				return err
			}
		}
		// What comes after the live position is the live projector's to apply.
		r.setHead(max(to, r.progress.Position))
		return nil
	})
	if err != nil {
		return fmt.Errorf("switch: %w", err)
	}
	r.phase(PhaseCleaning)
	if err := shadow.Cleanup(ctx); err != nil {
		return fmt.Errorf("remove the old state: %w", err)
	}
	r.phase(PhaseDone)
	return nil
}

type replay struct {
	log      *events.Log
	shadow   Shadow
	opts     ReplayOptions
	progress Progress
	applied  uint64 // events applied in this run, for the rate
}

func (r *replay) phase(p string) {
	r.progress.Phase = p
	r.opts.Progress(r.progress)
}

func (r *replay) setHead(head uint64) {
	p := &r.progress
	p.Head = head
	if head >= p.From {
		p.Total = head - p.From + 1
	}
	if p.Position >= p.From {
		p.Done = p.Position - p.From + 1
	}
	elapsed := r.opts.Now().Sub(p.Started).Seconds()
	if elapsed > 0 && r.applied > 0 {
		p.Rate = float64(r.applied) / elapsed
		p.ETA = time.Duration(float64(p.Total-min(p.Done, p.Total)) / p.Rate * float64(time.Second))
	}
}

// errReached stops a read at its target.
var errReached = errors.New("target reached")

// apply reads from opts up to sequence to (or the log's end) and applies it in
// batches. A shadow that is a Pipeliner is sent each batch before the one
// before it is applied (see Runner); all are applied when apply returns.
func (r *replay) apply(ctx context.Context, read events.ReadOptions, to uint64) error {
	read.StopAtEnd, read.IncludeUnknown = true, true
	pl, _ := r.shadow.(Pipeliner)
	batch := make([]events.Record, 0, r.opts.BatchSize)
	var out *sentBatch // sent to pl, not yet known applied
	defer func() {
		if out != nil {
			<-out.result //nolint:errcheck // waited for so that no transaction outlives the call
		}
	}()
	// settle waits for the batch outstanding, next taking its place. If it
	// failed (an event the bulk statements could not store, a lost
	// connection), next is void or applied: both are applied again the
	// careful way, which names an event at fault and skips it.
	settle := func(next *sentBatch) error {
		prev := out
		out = next
		if prev == nil {
			return nil
		}
		err := <-prev.result
		if err == nil {
			r.done(prev.batch)
			return nil
		}
		again := [][]events.Record{prev.batch}
		if next != nil {
			<-next.result //nolint:errcheck // void, or applied: applied again, it changes nothing
			out = nil
			again = append(again, next.batch)
		}
		for _, b := range again {
			if err := r.applyBatch(ctx, b); err != nil {
				return err
			}
			r.done(b)
		}
		return nil
	}
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if pl == nil {
			if err := r.applyBatch(ctx, batch); err != nil {
				return err
			}
			r.done(batch)
			batch = batch[:0]
			return nil
		}
		next := &sentBatch{batch: batch, result: pl.Send(ctx, batch)}
		batch = make([]events.Record, 0, r.opts.BatchSize)
		return settle(next)
	}
	err := r.log.Read(ctx, read, func(rec events.Record) error {
		if rec.Seq > to {
			return errReached
		}
		batch = append(batch, rec)
		if len(batch) == r.opts.BatchSize {
			if err := flush(); err != nil {
				return err
			}
		}
		if rec.Seq == to {
			return errReached
		}
		return nil
	})
	if err != nil && !errors.Is(err, errReached) {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := flush(); err != nil {
		return err
	}
	return settle(nil) // the last batch sent
}

// sentBatch is a batch sent to a Pipeliner shadow.
type sentBatch struct {
	batch  []events.Record
	result <-chan error
}

// done records batch as applied: progress, and a report of it.
func (r *replay) done(batch []events.Record) {
	r.applied += uint64(len(batch))
	r.progress.Position = batch[len(batch)-1].Seq
	r.setHead(max(r.progress.Head, r.progress.Position))
	r.opts.Progress(r.progress)
}

// applyBatch applies a batch to the shadow; an event the projector cannot
// apply is applied as a no-op, as the live projector does once it has
// dead-lettered it.
func (r *replay) applyBatch(ctx context.Context, batch []events.Record) error {
	for {
		err := r.shadow.Apply(ctx, batch)
		var ee *EventError
		if !errors.As(err, &ee) {
			return err
		}
		found := false
		for i := range batch {
			if batch[i].Seq == ee.Seq && batch[i].Event != nil {
				batch[i].Event = nil
				found = true
			}
		}
		if !found {
			return err
		}
		r.progress.Skipped++
	}
}
