package http

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/http/media"
)

// syncOrder is the service's Pack, recording what it was asked in order and
// how long the log was at each Sync.
type syncOrder struct {
	*media.Pack
	log   *events.Log
	mu    sync.Mutex
	calls []string
	heads []uint64
}

func (s *syncOrder) Save(ctx context.Context, r io.Reader, maxSize int64) (media.Image, error) {
	s.mu.Lock()
	s.calls = append(s.calls, "save")
	s.mu.Unlock()
	return s.Pack.Save(ctx, r, maxSize)
}

func (s *syncOrder) Sync(ctx context.Context) error {
	head, err := s.log.Head(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.calls = append(s.calls, "sync")
	s.heads = append(s.heads, head)
	s.mu.Unlock()
	return s.Pack.Sync(ctx)
}

// TestPostSyncsItsImagesBeforeItsEvent: a post's event may refer only to
// durable images, so the store's Sync comes after every image's Save and
// before the event is in the log (a crash between the 202 and the sync would
// otherwise lose images the log refers to).
func TestPostSyncsItsImagesBeforeItsEvent(t *testing.T) {
	a := newTestApp(t)
	store := &syncOrder{Pack: a.media, log: a.log}
	ids, err := domain.NewIDGenerator(1)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	a.srv = NewServer(Deps{Logger: slog.New(slog.DiscardHandler), Registerer: reg, Gatherer: reg, Log: a.log, Media: store, Auth: a.auth, IDs: ids}, Config{})

	before, err := a.log.Head(t.Context())
	require.NoError(t, err)
	r := a.createPost(t, 7, append(images(pngImage(t, 2, 2), pngImage(t, 3, 3)), part{name: "caption", data: []byte("two")}))
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.raw)

	assert.Equal(t, []string{"save", "save", "sync"}, store.calls, "one sync, after both images")
	assert.Equal(t, []uint64{before}, store.heads, "synced before the event was appended")
	after, err := a.log.Head(t.Context())
	require.NoError(t, err)
	assert.Equal(t, before+1, after)
}
