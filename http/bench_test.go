package http

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/http/media"
)

// benchClients is the concurrency of the command benchmark, as the issue asks.
const benchClients = 64

// BenchmarkCommands measures, in one run on one machine: follow commands/s and
// post commands/s (one 1 KiB image each) through HTTP on loopback with the log
// at sync always and group commit, at 64 concurrent clients; the raw JetStream
// async publish rate of events of the same sizes with sync off; and the ratios.
//
//	go test -run '^$' -bench BenchmarkCommands -benchtime 1x ./http
func BenchmarkCommands(b *testing.B) {
	for b.Loop() {
		follows, followSize := runCommandLoad(b, "follow", 3*time.Second)
		posts, postSize := runCommandLoad(b, "post", 3*time.Second)
		rawFollow := rawPublishRate(b, followSize, 3*time.Second)
		rawPost := rawPublishRate(b, postSize, 3*time.Second)
		b.ReportMetric(follows, "follows/s")
		b.ReportMetric(rawFollow, "raw-follow-size-publish/s")
		b.ReportMetric(follows/rawFollow, "follow-ratio")
		b.ReportMetric(posts, "posts/s")
		b.ReportMetric(rawPost, "raw-post-size-publish/s")
		b.ReportMetric(posts/rawPost, "post-ratio")
		fmt.Fprintf(os.Stderr, "follows %.0f/s (events %d B) vs raw %.0f/s: ratio %.2f; posts %.0f/s (events %d B) vs raw %.0f/s: ratio %.2f\n",
			follows, followSize, rawFollow, follows/rawFollow, posts, postSize, rawPost, posts/rawPost)
	}
}

// noisePNG is a PNG of about size bytes (random pixels do not compress).
func noisePNG(b *testing.B, size int) []byte {
	side := 8
	for {
		img := image.NewRGBA(image.Rect(0, 0, side, side))
		for i := range img.Pix {
			img.Pix[i] = byte(rand.IntN(256))
		}
		img.Set(0, 0, color.RGBA{A: 255})
		var buf bytes.Buffer
		if err := png.Encode(&buf, img); err != nil {
			b.Fatal(err)
		}
		if buf.Len() >= size || side > 64 {
			return buf.Bytes()
		}
		side++
	}
}

// runCommandLoad drives the real app on one sync-always server with
// benchClients clients for d; it returns commands/s and the size of one stored
// event.
func runCommandLoad(b *testing.B, kind string, d time.Duration) (float64, int) {
	b.Helper()
	ns, err := localstack.StartNATS(localstack.NATSConfig{Dir: b.TempDir(), SyncAlways: true}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL(), nats.ReconnectBufSize(-1))
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	return commandLoad(b, js, events.Config{}, kind, benchClients, d)
}

// commandLoad serves the real app over loopback HTTP against a log of cfg on
// js and drives it with clients concurrent clients for d; it returns
// commands/s and the size of one stored event.
func commandLoad(b *testing.B, js jetstream.JetStream, cfg events.Config, kind string, clients int, d time.Duration) (float64, int) {
	b.Helper()
	quiet := slog.New(slog.DiscardHandler)
	log, err := events.OpenLog(context.Background(), js, cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	store, err := media.NewPack(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	auth, _ := NewAuthenticator(testSecret, nil)
	ids, _ := domain.NewIDGenerator(1)
	reg := prometheus.NewRegistry()
	srv := NewServer(Deps{Logger: quiet, Registerer: reg, Gatherer: reg, Log: log, Media: store, Auth: auth, IDs: ids}, Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Shutdown(context.Background()) }()
	base := "http://" + ln.Addr().String()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	img := noisePNG(b, 1024)
	var done atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	start := time.Now()
	for w := range clients {
		user := domain.UserID(w + 1)
		tok, _ := auth.Mint(user, false, time.Now(), time.Hour)
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				var req *http.Request
				if kind == "follow" {
					req, _ = http.NewRequest(http.MethodPost, fmt.Sprintf("%s/users/%d/follow", base, 1000+i), nil)
				} else {
					ct, body := multipartBody(b, append(images(img), part{name: "caption", data: []byte("benchmark post")})...)
					req, _ = http.NewRequest(http.MethodPost, base+"/posts", bytes.NewReader(body))
					req.Header.Set("Content-Type", ct)
				}
				req.Header.Set("Authorization", "Bearer "+tok)
				resp, err := client.Do(req)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted {
					firstErr.CompareAndSwap(nil, fmt.Errorf("status %d", resp.StatusCode))
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := firstErr.Load().(error); err != nil {
		b.Fatalf("%s load: %v", kind, err)
	}
	stream, err := js.Stream(context.Background(), log.Stream())
	if err != nil {
		b.Fatal(err)
	}
	last, err := stream.GetLastMsgForSubject(context.Background(), events.AllSubjects)
	if err != nil {
		b.Fatal(err)
	}
	return float64(done.Load()) / elapsed.Seconds(), len(last.Data)
}

// rawPublishRate is the limit the service is measured against: async publishes
// of size-byte events (with the same two headers the service sets) into the same
// stream configuration with sync off, as fast as JetStream takes them.
func rawPublishRate(b *testing.B, size int, d time.Duration) float64 {
	b.Helper()
	ns, err := localstack.StartNATS(localstack.NATSConfig{Dir: b.TempDir()}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	log, err := events.OpenLog(context.Background(), js, events.Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	data := bytes.Repeat([]byte("x"), size)
	start := time.Now()
	n := 0
	for deadline := start.Add(d); time.Now().Before(deadline); {
		for range 1000 {
			if _, err := js.PublishMsgAsync(followMsg(n%1000+1, n+1, fmt.Sprintf("raw-%d", n), data)); err != nil {
				b.Fatal(err)
			}
			n++
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		b.Fatal("raw publishes not acknowledged")
	}
	return float64(n) / time.Since(start).Seconds()
}
