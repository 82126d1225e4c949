package http

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/natscluster"
	"github.com/feedproject/feed/events"
)

// rawCommits is how many atomic batches the raw limit keeps awaiting the
// server at once; the clients' events are shared between them.
const rawCommits = 2

// BenchmarkFollows measures follows/s through HTTP on loopback with the log at
// sync always, on one server (an R1 stream) and on a three-node cluster (an R3
// stream), at 64 and 512 concurrent clients; next to it, on the same servers,
// the raw limit: the clients' worth of same-sized follow events always in
// flight as atomic batches (rawCommits at a time), published by bare NATS
// messages, with no HTTP and no service code; and the ratio. For context it
// also measures the clients' worth of events in flight as single async
// publishes, each acknowledged on its own. Each phase has a new stream of the
// same configuration and a connection to the node leading it.
//
//	go test -run '^$' -bench BenchmarkFollows -benchtime 1x ./http
func BenchmarkFollows(b *testing.B) {
	for _, nodes := range []int{1, 3} {
		for _, clients := range []int{64, 512} {
			b.Run(fmt.Sprintf("nodes=%d/clients=%d", nodes, clients), func(b *testing.B) {
				for b.Loop() {
					stream := benchStreams(b, nodes)
					cfg := events.Config{Replicas: nodes}
					follows, size := commandLoad(b, stream(cfg), cfg, "follow", clients, 3*time.Second)
					atomicRate := rawAtomicRate(b, stream(cfg), clients, size, 2*time.Second)
					pipelined := rawPipelinedRate(b, stream(cfg), clients, size, 2*time.Second)
					b.ReportMetric(follows, "follows/s")
					b.ReportMetric(atomicRate, "raw-atomic/s")
					b.ReportMetric(follows/atomicRate, "ratio")
					b.ReportMetric(pipelined, "raw-async/s")
					fmt.Fprintf(os.Stderr, "%d node(s), %d clients: follows %.0f/s (events %d B) vs raw atomic batches %.0f/s: ratio %.2f (raw async publishes %.0f/s)\n",
						nodes, clients, follows, size, atomicRate, follows/atomicRate, pipelined)
				}
			})
		}
	}
}

// benchStreams starts one sync-always server, or a sync-always cluster of
// nodes, in the benchmark's process. Each call of stream replaces the event
// stream with a new one of cfg and returns a connection to the node leading
// it, so that every phase starts from an empty stream and none pays a route
// hop the others do not.
func benchStreams(b *testing.B, nodes int) (stream func(events.Config) jetstream.JetStream) {
	b.Helper()
	connect := func(url string) jetstream.JetStream {
		nc, err := nats.Connect(url, nats.ReconnectBufSize(-1))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
		if err != nil {
			b.Fatal(err)
		}
		return js
	}
	var admin jetstream.JetStream
	leaderURL := func(string) string { return "" }
	if nodes == 1 {
		ns, err := localstack.StartNATS(localstack.NATSConfig{Dir: b.TempDir(), SyncAlways: true}, slog.New(slog.DiscardHandler))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(ns.Shutdown)
		admin = connect(ns.ClientURL())
		leaderURL = func(string) string { return ns.ClientURL() }
	} else {
		c := natscluster.Start(b, natscluster.Config{Nodes: nodes, SyncAlways: true})
		admin = connect(c.URLs())
		leaderURL = func(name string) string { return c.URL(c.WaitForStreamLeader(name, 10*time.Second)) }
	}
	return func(cfg events.Config) jetstream.JetStream {
		ctx := context.Background()
		name := cfg.Name
		if name == "" {
			name = "FEED_EVENTS"
		}
		if err := admin.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			b.Fatal(err)
		}
		log, err := events.OpenLog(ctx, admin, cfg, nil)
		if err != nil {
			b.Fatal(err)
		}
		log.Close()
		return connect(leaderURL(name))
	}
}

// followMsg is a follow event of the service's subject and headers, with a
// body of size bytes.
func followMsg(follower, followee int, id string, data []byte) *nats.Msg {
	m := nats.NewMsg(fmt.Sprintf("ev.%d.follow.%d", follower, followee))
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, id)
	m.Header.Set(events.TypeHeader, events.TypeUserFollowed)
	return m
}

// rawPipelinedRate is async publishes of size-byte follow events, clients of
// them awaiting acknowledgement at any time, for d.
func rawPipelinedRate(b *testing.B, js jetstream.JetStream, clients, size int, d time.Duration) float64 {
	b.Helper()
	data := bytes.Repeat([]byte("x"), size)
	inflight := make(chan jetstream.PubAckFuture, clients)
	acked := make(chan error, 1)
	go func() {
		for f := range inflight {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				acked <- err
				for range inflight {
				}
				return
			}
		}
		acked <- nil
	}()
	start := time.Now()
	n := 0
	for deadline := start.Add(d); time.Now().Before(deadline); n++ {
		f, err := js.PublishMsgAsync(followMsg(n%clients+1, n+1000, "async-"+strconv.Itoa(n), data))
		if err != nil {
			b.Fatal(err)
		}
		inflight <- f
	}
	close(inflight)
	if err := <-acked; err != nil {
		b.Fatalf("raw async publishes: %v", err)
	}
	return float64(n) / time.Since(start).Seconds()
}

// rawAtomicRate is the limit the service is measured against: clients follow
// events of size bytes always in flight as rawCommits atomic batches, each
// sent and committed back to back on js's connection, for d.
func rawAtomicRate(b *testing.B, js jetstream.JetStream, clients, size int, d time.Duration) float64 {
	b.Helper()
	nc := js.Conn()
	data := bytes.Repeat([]byte("x"), size)
	per := clients / rawCommits
	var stored atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for c := range rawCommits {
		wg.Go(func() {
			for k := 0; time.Now().Before(deadline); k++ {
				id := fmt.Sprintf("raw-%d-%d", c, k)
				var resp *nats.Msg
				var err error
				for i := range per {
					m := followMsg(c*per+i+1, k+1000, id+"-"+strconv.Itoa(i), data)
					m.Header.Set("Nats-Batch-Id", id)
					m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(i+1))
					if i < per-1 {
						err = nc.PublishMsg(m)
					} else {
						m.Header.Set("Nats-Batch-Commit", "1")
						resp, err = nc.RequestMsg(m, 10*time.Second)
					}
					if err != nil {
						firstErr.CompareAndSwap(nil, err)
						return
					}
				}
				var ack struct {
					Count int `json:"count"`
					Error *struct {
						Description string `json:"description"`
					} `json:"error"`
				}
				if err := json.Unmarshal(resp.Data, &ack); err != nil || ack.Error != nil || ack.Count != per {
					firstErr.CompareAndSwap(nil, fmt.Errorf("batch %s answered %s", id, resp.Data))
					return
				}
				stored.Add(int64(per))
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		b.Fatalf("raw atomic batches: %v", err)
	}
	return float64(stored.Load()) / time.Since(start).Seconds()
}
