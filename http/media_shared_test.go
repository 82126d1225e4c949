package http

import (
	"bytes"
	"crypto/rand"
	"image"
	"image/png"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/http/media"
)

// TestReplicasServeTheImagesEachOtherStored: two API servers, each with its
// own connection to JetStream and its own object store over the one bucket,
// as two replicas run; an image posted through either is served by both.
func TestReplicasServeTheImagesEachOtherStored(t *testing.T) {
	ns := localstacktest.NATSForTest(t)
	replica := func(node int) *testApp {
		return newReplica(t, ns, node, Config{}, func(js jetstream.JetStream, log *events.Log) media.Store {
			store, err := media.NewObjectStore(t.Context(), js, media.ObjectStoreConfig{Replicas: log.Replicas(), TempDir: t.TempDir()})
			require.NoError(t, err)
			return store
		})
	}
	replicas := []*testApp{replica(1), replica(2)}
	// Each replica stores one small image, and one larger than is received
	// in memory, so that it is sent in several chunks.
	var want [][]byte
	for i, a := range replicas {
		small, large := pngImage(t, 3+i, 3), randomPNG(t, 400+i)
		require.Greater(t, len(large), 400<<10, "past what is received in memory, and several chunks")
		r := a.createPost(t, domain.UserID(10+i), images(small, large))
		require.Equal(t, http.StatusAccepted, r.status, "%s", r.raw)
		want = append(want, small, large)
	}
	var keys []string
	for _, rec := range replicas[0].records(t) {
		for _, m := range rec.Event.(events.PostCreated).Media {
			keys = append(keys, m.Key)
		}
	}
	require.Len(t, keys, len(want))
	for _, a := range replicas {
		for i, key := range keys {
			resp, err := a.srv.App().Test(httptest.NewRequest(http.MethodGet, "/media/"+key, nil), 30_000)
			require.NoError(t, err)
			var got bytes.Buffer
			_, err = got.ReadFrom(resp.Body)
			require.NoError(t, err)
			require.NoError(t, resp.Body.Close())
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "image/png", resp.Header.Get("Content-Type"))
			assert.Equal(t, want[i], got.Bytes(), "image %d through replica %p", i, a)
		}
	}
}

// randomPNG is a w×w PNG of random pixels: it does not compress.
func randomPNG(t *testing.T, w int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, w))
	_, _ = rand.Read(img.Pix)
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, img))
	return buf.Bytes()
}
