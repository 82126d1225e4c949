package media_test

import (
	"bytes"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/http/media"
)

// TestObjectStoreSavesAsTheOtherStores: the object store keeps the limits,
// sniffing and keys of the others, and a refused upload leaves nothing in
// the bucket.
func TestObjectStoreSavesAsTheOtherStores(t *testing.T) {
	root := t.TempDir()
	o := openObjectStore(t, root)
	empty := objectStoreBytes(t, root)

	refused := map[string]struct {
		body io.Reader
		want error
	}{
		"text":            {bytes.NewReader([]byte("hello")), domain.ErrUnsupportedMedia},
		"empty":           {bytes.NewReader(nil), domain.ErrInvalid},
		"too many pixels": {bytes.NewReader(gifScreen(7000, 7000)), domain.ErrInvalid},
		"too large":       {io.MultiReader(bytes.NewReader(pngBytes(t, 2, 2)), endless{}), domain.ErrTooLarge},
	}
	for name, tt := range refused {
		body := &countingReader{r: tt.body}
		_, err := o.Save(t.Context(), body, limit)
		require.ErrorIs(t, err, tt.want, name)
		assert.LessOrEqual(t, body.n, int64(limit+1), "%s: read no further than one byte past the limit", name)
	}
	assert.Equal(t, empty, objectStoreBytes(t, root), "refused uploads leave nothing")

	data := noisyPNG(t, 300, 7) // several chunks
	first, err := o.Save(t.Context(), bytes.NewReader(data), limit)
	require.NoError(t, err)
	assert.Equal(t, media.Image{Key: keyOf(data, "png"), ContentType: "image/png", Width: 300, Height: 300, Size: int64(len(data))}, first)
	stored := objectStoreBytes(t, root)
	img := saveAtOnce(t, o, data, 4)
	assert.Equal(t, first, img)
	assert.Less(t, objectStoreBytes(t, root), stored+int64(len(data)), "the bytes are stored once")

	got, opened := readImage(t, o, first.Key)
	assert.Equal(t, data, got)
	assert.Equal(t, media.Image{Key: first.Key, ContentType: "image/png", Size: first.Size}, opened)
	_, _, err = o.Open(t.Context(), keyOf([]byte("absent"), "png"))
	assert.ErrorIs(t, err, domain.ErrNotFound)
	_, _, err = o.Open(t.Context(), "../"+first.Key)
	assert.ErrorIs(t, err, domain.ErrNotFound)
}
