package http

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/http/media"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/readmodel"
)

// shiftedClock is the time now plus an offset a test moves forward.
type shiftedClock struct{ offset atomic.Int64 }

func (c *shiftedClock) now() time.Time           { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *shiftedClock) advance(by time.Duration) { c.offset.Add(int64(by)) }

// collectWorld is the API with its pack store, the log and the read model
// projector, and a collector of the store's images.
type collectWorld struct {
	*testApp
	root      string
	read      *readmodel.Store
	collector *media.Collector
	// clock is the collector's; commands is the API's.
	clock, commands shiftedClock
}

// newCollectWorld starts the world; the read model projector starts when
// startReadModel is closed (nil: at once). refs wraps the read model as the
// collector sees it (nil: as it is).
func newCollectWorld(t *testing.T, grace time.Duration, startReadModel <-chan struct{}, refs func(media.References) media.References) *collectWorld {
	t.Helper()
	ns := localstacktest.NATSForTest(t)
	pg := localstacktest.PostgresForTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	log, err := events.OpenLog(ctx, js, events.Config{}, nil)
	require.NoError(t, err)
	pool, err := readmodel.OpenPool(ctx, pg.URL(), migrations.Schema, 0)
	require.NoError(t, err)
	quiet := slog.New(slog.DiscardHandler)
	run := projections.NewRunner(log, readmodel.NewProjector(pool, nil),
		projections.RunnerConfig{FetchWait: 200 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}, nil, quiet)
	var wg sync.WaitGroup
	wg.Go(func() {
		if startReadModel != nil {
			select {
			case <-startReadModel:
			case <-ctx.Done():
				return
			}
		}
		_ = run.Run(ctx)
	})
	root := filepath.Join(t.TempDir(), "media")
	store, err := media.NewPack(root)
	require.NoError(t, err)
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		_ = store.Close()
		log.Close()
		nc.Close()
		pool.Close()
	})
	auth, err := NewAuthenticator(testSecret, nil)
	require.NoError(t, err)
	ids, err := domain.NewIDGenerator(1)
	require.NoError(t, err)
	w := &collectWorld{root: root, read: readmodel.NewStore(pool)}
	var seen media.References = w.read
	if refs != nil {
		seen = refs(w.read)
	}
	w.collector = media.NewCollector(store, log, seen, media.CollectorConfig{Grace: grace, CatchUp: 3 * time.Second, Now: w.clock.now}, quiet)
	reg := prometheus.NewRegistry()
	w.testApp = &testApp{log: log, js: js, auth: auth, media: store, now: time.Now()}
	w.srv = NewServer(Deps{
		Logger: quiet, Registerer: reg, Gatherer: reg, Log: log, Media: store, Auth: auth, IDs: ids,
		ReadModel: w.read, MediaCollector: w.collector, Now: w.commands.now,
	}, Config{})
	return w
}

// storeBytes is the size of every file of the media store.
func (w *collectWorld) storeBytes(t *testing.T) int64 {
	t.Helper()
	var n int64
	require.NoError(t, filepath.WalkDir(w.root, func(_ string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		info, err := e.Info()
		n += info.Size()
		return err
	}))
	return n
}

// collect runs a collection through the admin route.
func (w *collectWorld) collect(t *testing.T) response {
	t.Helper()
	tok, err := w.auth.Mint(1, true, time.Now(), time.Hour)
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodPost, "/admin/media/collect", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	return w.do(t, req)
}

// served reports whether GET /media/{key} serves the image.
func (w *collectWorld) served(t *testing.T, key string) bool {
	t.Helper()
	r := w.do(t, httptest.NewRequest(http.MethodGet, "/media/"+key, nil))
	require.Contains(t, []int{http.StatusOK, http.StatusNotFound}, r.status, "%s", r.raw)
	return r.status == http.StatusOK
}

func keyOf(data []byte, ext string) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]) + "." + ext
}

// largePNG is a valid PNG header followed by size bytes of noise: the store
// reads only the header, and the noise makes each one distinct.
func largePNG(t *testing.T, size int, seed uint64) []byte {
	t.Helper()
	data := pngImage(t, 2, 2)
	noise := make([]byte, size)
	rng := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	_, _ = rng.Read(noise)
	return append(data, noise...)
}

func (w *collectWorld) postImages(t *testing.T, user domain.UserID, data ...[]byte) response {
	t.Helper()
	return w.createPost(t, user, images(data...))
}

// TestCollectionTakesTheImagesOfARefusedPost: eleven images of 4.4 MiB are
// refused, leaving ten in the store; past the grace, a collection takes them
// and the store is back to its size before, its live images served.
func TestCollectionTakesTheImagesOfARefusedPost(t *testing.T) {
	w := newCollectWorld(t, time.Hour, nil, nil)
	liveData := pngImage(t, 5, 5)
	r := w.postImages(t, 501, liveData)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.raw)
	before := w.storeBytes(t)
	var large [][]byte
	for i := range 11 {
		large = append(large, largePNG(t, 4_400_000, uint64(i)))
	}

	r = w.postImages(t, 501, large...)
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.raw)
	require.Greater(t, w.storeBytes(t), before+40_000_000, "the refused upload's images are stored")

	// Within the grace nothing is taken.
	r = w.collect(t)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	assert.InDelta(t, 0, r.body["removed"], 0)
	w.clock.advance(time.Hour + time.Minute)
	r = w.collect(t)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)

	assert.InDelta(t, 10, r.body["removed"], 0)
	assert.Equal(t, before, w.storeBytes(t), "the store is back to its size before")
	assert.True(t, w.served(t, keyOf(liveData, "png")))
	assert.False(t, w.served(t, keyOf(large[0], "png")))
}

// TestCollectionKeepsImagesOfLivePostsAndThoseOfPostsDeletedWithinTheGrace:
// an image is taken once the post that showed it was deleted more than the
// grace ago and no other post shows it; a live post's never.
func TestCollectionKeepsImagesOfLivePostsAndThoseOfPostsDeletedWithinTheGrace(t *testing.T) {
	w := newCollectWorld(t, time.Hour, nil, nil)
	shared, own, live := pngImage(t, 6, 6), pngImage(t, 7, 7), pngImage(t, 8, 8)
	first := w.postImages(t, 501, shared, own)
	require.Equal(t, http.StatusAccepted, first.status, "%s", first.raw)
	second := w.postImages(t, 502, shared, live)
	require.Equal(t, http.StatusAccepted, second.status, "%s", second.raw)
	// Deleted two hours after the uploads.
	w.commands.advance(2 * time.Hour)
	del := w.command(t, http.MethodDelete, "/posts/"+first.body["id"].(string), 501, "")
	require.Equal(t, http.StatusAccepted, del.status, "%s", del.raw)

	// Just after the delete: every image is old, the deleted post's within
	// the grace.
	w.clock.advance(2*time.Hour + time.Minute)
	r := w.collect(t)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	assert.InDelta(t, 3, r.body["considered"], 0)
	assert.InDelta(t, 0, r.body["removed"], 0)

	w.clock.advance(time.Hour)
	r = w.collect(t)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)

	assert.InDelta(t, 1, r.body["removed"], 0)
	assert.False(t, w.served(t, keyOf(own, "png")), "the deleted post's own image")
	assert.True(t, w.served(t, keyOf(shared, "png")), "shown by a live post too")
	assert.True(t, w.served(t, keyOf(live, "png")))
}

// TestCollectionWaitsForThePostsInTheLog: a post appended to the log but not
// yet in the read model keeps its image; collection waits for the read
// model, and removes nothing while it lags.
func TestCollectionWaitsForThePostsInTheLog(t *testing.T) {
	start := make(chan struct{})
	w := newCollectWorld(t, time.Hour, start, nil)
	data := pngImage(t, 9, 9)
	r := w.postImages(t, 501, data)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.raw)
	w.clock.advance(2 * time.Hour)

	r = w.collect(t)
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.raw)
	assert.True(t, w.served(t, keyOf(data, "png")))

	close(start)
	r = w.collect(t)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	assert.InDelta(t, 1, r.body["considered"], 0)
	assert.InDelta(t, 0, r.body["removed"], 0)
	assert.True(t, w.served(t, keyOf(data, "png")))
}

// postDuringCheck is the read model as the collector sees it, which, once it
// has answered that images are unreferenced, has a post with one of them
// appended before the collector goes on to remove them.
type postDuringCheck struct {
	media.References
	post func()
	once sync.Once
}

func (p *postDuringCheck) MediaReferenced(ctx context.Context, keys []string, since time.Time) (map[string]bool, error) {
	refd, err := p.References.MediaReferenced(ctx, keys, since)
	p.once.Do(p.post)
	return refd, err
}

// TestCollectionKeepsAnImagePostedWhileItRuns: an image a refused command
// left, old enough to collect, is posted again after the collection checked
// the read model and before it removes: the post's image survives.
func TestCollectionKeepsAnImagePostedWhileItRuns(t *testing.T) {
	const grace = 2 * time.Second
	var w *collectWorld
	data := pngImage(t, 10, 10)
	var posted response
	w = newCollectWorld(t, grace, nil, func(refs media.References) media.References {
		return &postDuringCheck{References: refs, post: func() { posted = w.postImages(t, 502, data) }}
	})
	// The first ten are stored, the eleventh refused.
	eleven := [][]byte{data}
	for i := range 10 {
		eleven = append(eleven, pngImage(t, 11+i, 3))
	}
	r := w.postImages(t, 501, eleven...)
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r.raw)
	// Past the grace, and the second its time of saving may be rounded to.
	time.Sleep(grace + 1100*time.Millisecond)

	r = w.collect(t)
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)

	require.Equal(t, http.StatusAccepted, posted.status, "%s", posted.raw)
	assert.InDelta(t, 9, r.body["removed"], 0, "the others are taken")
	assert.True(t, w.served(t, keyOf(data, "png")), "the posted image is kept")
	r = w.command(t, http.MethodGet, "/posts/"+posted.body["id"].(string), 0, "", "X-Min-Position", posted.body["position"].(string))
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
}
