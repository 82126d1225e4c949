package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/domain"
)

// Headers of JetStream's atomic batch publish.
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// commitTimeout bounds one batch's exchange with the server.
const commitTimeout = 5 * time.Second

// maxInflight is how many commits may await the server at once. An atomic
// batch costs the server a fixed several milliseconds (it stages each batch in a
// store of its own) however small it is, so one commit at a time caps
// throughput at one batch per staging time; but more than two in flight slowed
// the server down. Measured with 64 concurrent appenders and sync always on the
// development machine: 1 in flight 3 071/s, 2 → 4 162/s, 4 → 2 456/s, 8 → 1 086/s.
const maxInflight = 2

// defaultAtomicFrom is the smallest group committed as one atomic batch. The
// server stages an R1 file stream's atomic batch in a store of its own, created,
// synced and removed for every batch; a sync per event is cheaper than that for
// small groups. Measured on the development machine (sync always, 64
// concurrent appenders, CPU of the process holding server and client): at 800
// appends/s, every group atomic 470–500 µs of CPU per append, p99 8.6 ms;
// pipelined up to 15, atomic from 16, 400–480 µs, p99 2.4 ms. At 9 000/s only
// the mixed committer keeps up: p50 11 ms against 153 ms, and groups of 32 or
// more atomic fall behind too.
const defaultAtomicFrom = 16

// committer is group commit. Appends that arrive while commits are under way
// wait, and go together in the next commit: a large group as a single atomic
// batch, which the server writes and syncs once, so with sync always every
// acknowledged event is on disk without a sync per event; a small one as
// pipelined publishes, one acknowledgement each. A caller has one append under
// way at a time, so its appends stay in the order it made them.
type committer struct {
	js         jetstream.JetStream
	maxBatch   int
	atomicFrom int
	metrics    *Metrics
	slots      chan struct{}

	queue     chan *pendingAppend
	stop      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once
}

type pendingAppend struct {
	ctx  context.Context
	msg  *nats.Msg
	done chan appendResult
}

type appendResult struct {
	res Appended
	err error
}

func startCommitter(js jetstream.JetStream, maxBatch, atomicFrom int, metrics *Metrics) *committer {
	c := &committer{
		js:         js,
		maxBatch:   max(maxBatch, 1),
		atomicFrom: max(atomicFrom, 2),
		metrics:    metrics,
		queue:      make(chan *pendingAppend),
		slots:      make(chan struct{}, maxInflight),
		stop:       make(chan struct{}),
		stopped:    make(chan struct{}),
	}
	go c.run()
	return c
}

var errLogClosed = fmt.Errorf("event log is closing: %w", domain.ErrUnavailable)

// append hands msg to the commit loop and waits for its outcome.
func (c *committer) append(ctx context.Context, msg *nats.Msg) (Appended, error) {
	p := &pendingAppend{ctx: ctx, msg: msg, done: make(chan appendResult, 1)}
	select {
	case c.queue <- p:
	case <-ctx.Done():
		return Appended{}, fmt.Errorf("%w: %w", errNotSent, ctx.Err())
	case <-c.stop:
		return Appended{}, fmt.Errorf("%w: %w", errNotSent, errLogClosed)
	}
	// Once taken, the append is committed or failed by the loop, never dropped:
	// waiting for its answer keeps a caller from reporting failure for an event
	// that is then stored.
	r := <-p.done
	return r.res, r.err
}

func (c *committer) close() {
	c.closeOnce.Do(func() { close(c.stop) })
	<-c.stopped
}

func (c *committer) run() {
	var inflight sync.WaitGroup
	defer close(c.stopped)
	defer inflight.Wait()
	for {
		var first *pendingAppend
		select {
		case first = <-c.queue:
		case <-c.stop:
			return
		}
		// Wait for a free slot before collecting: appends arriving meanwhile
		// join this batch instead of each taking a slot of its own.
		c.slots <- struct{}{}
		batch := []*pendingAppend{first}
	collect:
		// Take whoever is already waiting; never wait for more.
		for len(batch) < c.maxBatch {
			select {
			case p := <-c.queue:
				batch = append(batch, p)
			default:
				break collect
			}
		}
		inflight.Go(func() {
			defer func() { <-c.slots }()
			c.commit(batch)
		})
	}
}

// commit stores a batch and answers each append in it.
func (c *committer) commit(batch []*pendingAppend) {
	live := batch[:0]
	for _, p := range batch {
		if err := p.ctx.Err(); err != nil {
			p.done <- appendResult{err: fmt.Errorf("%w: %w", errNotSent, err)}
			continue
		}
		live = append(live, p)
	}
	c.metrics.observeBatch(len(live))
	switch len(live) {
	case 0:
		return
	case 1:
		res, err := publishOne(live[0].ctx, c.js, live[0].msg)
		live[0].done <- appendResult{res: res, err: err}
		return
	}
	if len(live) < c.atomicFrom {
		c.publishPipelined(live)
		return
	}
	first, err := c.publishBatch(live)
	if err == nil {
		for i, p := range live {
			p.done <- appendResult{res: Appended{Seq: first + uint64(i)}}
		}
		return
	}
	if !errors.Is(err, errBatchRefused) {
		// The exchange broke: the batch may be stored. The appends find out
		// (see Log.resolve).
		for _, p := range live {
			p.done <- appendResult{err: fmt.Errorf("%w: %w", errMaybeStored, err)}
		}
		return
	}
	// The server refused the batch: one of its events is a retry (it refuses
	// duplicates inside atomic batches). Each event then goes alone, and a
	// retry is answered with its first sequence.
	for _, p := range live {
		res, err := publishOne(p.ctx, c.js, p.msg)
		p.done <- appendResult{res: res, err: err}
	}
}

// publishPipelined sends every append of the group before waiting for the
// first acknowledgement, and answers each with its own. The server stores them
// in the order sent; each stands alone, so a retry among them is answered as a
// duplicate without failing the others.
func (c *committer) publishPipelined(group []*pendingAppend) {
	futures := make([]jetstream.PubAckFuture, len(group))
	for i, p := range group {
		f, err := c.js.PublishMsgAsync(p.msg)
		if err != nil {
			// Refused by the client before sending (too many acknowledgements
			// pending, the connection closed).
			p.done <- appendResult{err: fmt.Errorf("%w: %w", errNotSent, err)}
			continue
		}
		futures[i] = f
	}
	wait, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	for i, f := range futures {
		if f == nil {
			continue
		}
		p := group[i]
		select {
		case ack := <-f.Ok():
			p.done <- appendResult{res: Appended{Seq: ack.Sequence, Duplicate: ack.Duplicate}}
		case err := <-f.Err():
			p.done <- appendResult{err: err}
		case <-p.ctx.Done():
			p.done <- appendResult{err: p.ctx.Err()}
		case <-wait.Done():
			p.done <- appendResult{err: fmt.Errorf("publish %s: %w", p.msg.Subject, wait.Err())}
		}
	}
}

// batchAck is the server's answer to a batch commit.
type batchAck struct {
	Stream string         `json:"stream"`
	Seq    uint64         `json:"seq"`
	Batch  string         `json:"batch"`
	Count  int            `json:"count"`
	Error  *batchAckError `json:"error,omitempty"`
}

type batchAckError struct {
	Code        int    `json:"code"`
	ErrCode     int    `json:"err_code"`
	Description string `json:"description"`
}

var errBatchRefused = errors.New("atomic batch refused")

// publishBatch publishes the events as one atomic batch and returns the sequence
// of the first; an atomic batch is stored whole, in order, in consecutive
// sequences, or not at all.
func (c *committer) publishBatch(batch []*pendingAppend) (uint64, error) {
	nc := c.js.Conn()
	id := uuid.NewString()
	for i, p := range batch {
		m := nats.NewMsg(p.msg.Subject)
		m.Data = p.msg.Data
		for k, v := range p.msg.Header {
			m.Header[k] = v
		}
		m.Header.Set(batchIDHeader, id)
		m.Header.Set(batchSeqHeader, strconv.Itoa(i+1))
		if i < len(batch)-1 {
			if err := nc.PublishMsg(m); err != nil {
				return 0, fmt.Errorf("publish batch %s: %w", id, err)
			}
			continue
		}
		m.Header.Set(batchCommitHeader, "1")
		ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
		resp, err := nc.RequestMsgWithContext(ctx, m)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("commit batch %s: %w", id, err)
		}
		var ack batchAck
		if err := json.Unmarshal(resp.Data, &ack); err != nil {
			return 0, fmt.Errorf("commit batch %s: bad answer %q: %w", id, resp.Data, err)
		}
		if ack.Error != nil {
			return 0, fmt.Errorf("%w: %s (%d)", errBatchRefused, ack.Error.Description, ack.Error.ErrCode)
		}
		if ack.Count != len(batch) || ack.Seq < uint64(len(batch)) {
			return 0, fmt.Errorf("commit batch %s: stored %d of %d events at %d", id, ack.Count, len(batch), ack.Seq)
		}
		return ack.Seq - uint64(len(batch)) + 1, nil
	}
	return 0, errors.New("empty batch")
}

// publishOne stores one event and waits for its acknowledgement.
func publishOne(ctx context.Context, js jetstream.JetStream, msg *nats.Msg) (Appended, error) {
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return Appended{}, err
	}
	return Appended{Seq: ack.Sequence, Duplicate: ack.Duplicate}, nil
}
