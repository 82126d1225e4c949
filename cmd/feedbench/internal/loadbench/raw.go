package loadbench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

// Raw limit measurements: ZADDs are pipelined rawChunk at a time from
// rawWorkers goroutines (as many as the feed appliers' partitions) into
// rawKeys keys; messages are the size of a post event.
const (
	rawChunk   = 200
	rawWorkers = 4
	rawKeys    = 10_000
	rawMsgSize = 400
)

// RawLimits are what the machine's Redis and JetStream do on their own,
// measured in the same run on the same servers as the service; a zero rate was
// not measured and Notes says why.
type RawLimits struct {
	// ZAdd is pipelined ZADD key score member per second.
	ZAdd float64
	// Publish is JetStream async publishes per second into a scratch stream on
	// the service's server (file storage, the server's own sync policy), each
	// with a message id as the service's are.
	Publish float64
	// Consume is messages per second an ordered consumer reads back.
	Consume float64
	Notes   []string
}

// measureRaw measures each limit for about d; a failure is a note, not an
// error, so that the rest of the run still happens.
func measureRaw(ctx context.Context, t Target, d time.Duration) RawLimits {
	var raw RawLimits
	if t.Redis == nil {
		raw.Notes = append(raw.Notes, "Redis ZADD not measured: no Redis address (set REDIS_URL)")
	} else if v, err := rawZAdd(ctx, t.Redis, d); err != nil {
		raw.Notes = append(raw.Notes, fmt.Sprintf("Redis ZADD failed: %v", err))
	} else {
		raw.ZAdd = v
	}
	if t.JetStream == nil {
		raw.Notes = append(raw.Notes, "JetStream publish and consume not measured: no NATS address (set NATS_URL)")
		return raw
	}
	pub, con, err := rawJetStream(ctx, t.JetStream, d)
	if err != nil {
		raw.Notes = append(raw.Notes, fmt.Sprintf("JetStream failed: %v", err))
	}
	raw.Publish, raw.Consume = pub, con
	return raw
}

func rawKey(worker, i int) string {
	return "bench:raw:{" + strconv.Itoa(worker) + "-" + strconv.Itoa(i) + "}"
}

// rawZAdd pipelines ZADDs into scratch keys for d and deletes them again.
func rawZAdd(ctx context.Context, rdb redis.UniversalClient, d time.Duration) (float64, error) {
	perWorker := rawKeys / rawWorkers
	defer func() {
		cctx := context.WithoutCancel(ctx)
		for w := range rawWorkers {
			pipe := rdb.Pipeline()
			for i := range perWorker {
				pipe.Unlink(cctx, rawKey(w, i))
			}
			_, _ = pipe.Exec(cctx)
		}
	}()
	start := time.Now()
	deadline := start.Add(d)
	counts := make([]int, rawWorkers)
	g, gctx := errgroup.WithContext(ctx)
	for w := range rawWorkers {
		g.Go(func() error {
			for n := 0; time.Now().Before(deadline); {
				pipe := rdb.Pipeline()
				for range rawChunk {
					pipe.ZAdd(gctx, rawKey(w, n%perWorker), redis.Z{Score: float64(n), Member: n})
					n++
				}
				if _, err := pipe.Exec(gctx); err != nil {
					return fmt.Errorf("pipelined zadd: %w", err)
				}
				counts[w] = n
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, err
	}
	total := 0
	for _, c := range counts {
		total += c
	}
	return float64(total) / time.Since(start).Seconds(), nil
}

// rawJetStream publishes into a scratch stream for d, reads it all back with
// an ordered consumer, and deletes the stream.
func rawJetStream(ctx context.Context, js jetstream.JetStream, d time.Duration) (publish, consume float64, err error) {
	name := "BENCH_RAW_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       name,
		Subjects:   []string{"benchraw." + name + ".>"},
		Storage:    jetstream.FileStorage,
		Duplicates: 2 * time.Minute,
	})
	if err != nil {
		return 0, 0, fmt.Errorf("create scratch stream: %w", err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), name) }()

	n, publish, err := rawPublish(ctx, js, name, d)
	if err != nil {
		return 0, 0, err
	}
	consume, err = rawConsume(ctx, stream, n)
	return publish, consume, err
}

func rawPublish(ctx context.Context, js jetstream.JetStream, name string, d time.Duration) (int, float64, error) {
	data := make([]byte, rawMsgSize)
	for i := range data {
		data[i] = 'a' + byte(i%26)
	}
	start := time.Now()
	n := 0
	for deadline := start.Add(d); time.Now().Before(deadline) && ctx.Err() == nil; {
		m := nats.NewMsg("benchraw." + name + "." + strconv.Itoa(n%1000))
		m.Data = data
		m.Header.Set(jetstream.MsgIDHeader, name+"-"+strconv.Itoa(n))
		if _, err := js.PublishMsgAsync(m); err != nil {
			if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				continue // the window is full: try again as acks come back
			}
			return 0, 0, fmt.Errorf("async publish: %w", err)
		}
		n++
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		return 0, 0, errors.New("async publishes not acknowledged within 30s")
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	return n, float64(n) / time.Since(start).Seconds(), nil
}

func rawConsume(ctx context.Context, stream jetstream.Stream, n int) (float64, error) {
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return 0, fmt.Errorf("ordered consumer: %w", err)
	}
	start := time.Now()
	it, err := cons.Messages()
	if err != nil {
		return 0, fmt.Errorf("ordered consumer: %w", err)
	}
	defer it.Stop()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for range n {
		if _, err := it.Next(jetstream.NextContext(ctx)); err != nil {
			return 0, fmt.Errorf("ordered consume: %w", err)
		}
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
