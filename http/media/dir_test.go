package media_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/image/webp"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/http/media"
)

const limit = 5 << 20

// tinyWebP is a 1x1 lossless (VP8L) WebP image; the test below checks that it
// decodes.
var tinyWebP = []byte{
	'R', 'I', 'F', 'F', 0x1a, 0x00, 0x00, 0x00, 'W', 'E', 'B', 'P',
	'V', 'P', '8', 'L', 0x0d, 0x00, 0x00, 0x00,
	0x2f, 0x00, 0x00, 0x00, 0x10, 0x07, 0x10, 0x11, 0x11, 0x88, 0x88, 0xfe, 0x07, 0x00,
}

func TestTinyWebPDecodes(t *testing.T) {
	img, err := webp.Decode(bytes.NewReader(tinyWebP))
	require.NoError(t, err)
	assert.Equal(t, image.Rect(0, 0, 1, 1), img.Bounds())
}

func picture(w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for x := range w {
		for y := range h {
			img.Set(x, y, color.RGBA{R: uint8(x), G: uint8(y), B: 0x80, A: 0xff})
		}
	}
	return img
}

func pngBytes(t *testing.T, w, h int) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, png.Encode(&b, picture(w, h)))
	return b.Bytes()
}

// gifScreen is a GIF header declaring a w×h screen and nothing else: all
// that reading an image's size looks at.
func gifScreen(w, h uint16) []byte {
	return []byte{'G', 'I', 'F', '8', '9', 'a', byte(w), byte(w >> 8), byte(h), byte(h >> 8), 0, 0, 0}
}

func jpegBytes(t *testing.T, w, h int) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, jpeg.Encode(&b, picture(w, h), nil))
	return b.Bytes()
}

func gifBytes(t *testing.T, w, h int) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, gif.Encode(&b, picture(w, h), nil))
	return b.Bytes()
}

func newDir(t *testing.T) (*media.Dir, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "media")
	d, err := media.NewDir(root)
	require.NoError(t, err)
	return d, root
}

// files lists every file under root, relative to it, sorted.
func files(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, path)
		out = append(out, filepath.ToSlash(rel))
		return err
	})
	require.NoError(t, err)
	sort.Strings(out)
	return out
}

func keyOf(data []byte, ext string) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]) + "." + ext
}

func shardPath(key string) string {
	return key[0:2] + "/" + key[2:4] + "/" + key
}

func TestNewDirCreatesDirectory(t *testing.T) {
	root := filepath.Join(t.TempDir(), "a", "b")
	_, err := media.NewDir(root)
	require.NoError(t, err)
	info, err := os.Stat(root)
	require.NoError(t, err)
	assert.True(t, info.IsDir())
}

func TestSaveDetectsTypeFromContent(t *testing.T) {
	tests := []struct {
		name        string
		data        []byte
		contentType string
		ext         string
		width       int
		height      int
	}{
		{"jpeg", jpegBytes(t, 40, 30), "image/jpeg", "jpg", 40, 30},
		{"png", pngBytes(t, 7, 300), "image/png", "png", 7, 300},
		{"gif", gifBytes(t, 16, 9), "image/gif", "gif", 16, 9},
		{"webp", tinyWebP, "image/webp", "webp", 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, root := newDir(t)

			img, err := d.Save(t.Context(), bytes.NewReader(tt.data), limit)
			require.NoError(t, err)

			want := media.Image{
				Key:         keyOf(tt.data, tt.ext),
				ContentType: tt.contentType,
				Width:       tt.width,
				Height:      tt.height,
				Size:        int64(len(tt.data)),
			}
			assert.Equal(t, want, img)
			assert.Equal(t, []string{shardPath(want.Key)}, files(t, root))

			rc, opened, err := d.Open(t.Context(), img.Key)
			require.NoError(t, err)
			defer rc.Close()
			got, err := io.ReadAll(rc)
			require.NoError(t, err)
			assert.Equal(t, tt.data, got)
			assert.Equal(t, img.Key, opened.Key)
			assert.Equal(t, tt.contentType, opened.ContentType)
			assert.Equal(t, int64(len(tt.data)), opened.Size)
		})
	}
}

func TestSaveSameBytesTwiceStoresOneFile(t *testing.T) {
	d, root := newDir(t)
	data := pngBytes(t, 3, 3)

	first, err := d.Save(t.Context(), bytes.NewReader(data), limit)
	require.NoError(t, err)
	second, err := d.Save(t.Context(), bytes.NewReader(data), limit)
	require.NoError(t, err)

	assert.Equal(t, first, second)
	assert.Equal(t, []string{shardPath(first.Key)}, files(t, root))
}

func TestSaveRejects(t *testing.T) {
	validPNG := pngBytes(t, 10, 10)
	tests := []struct {
		name    string
		data    []byte
		want    error
		message string
	}{
		{"text", []byte("hello"), domain.ErrUnsupportedMedia, "content is text/plain, not a JPEG, PNG, GIF or WebP image"},
		{"html", []byte("<html><img src=x></html>"), domain.ErrUnsupportedMedia, "content is text/html"},
		{"bmp", append([]byte("BM"), make([]byte, 60)...), domain.ErrUnsupportedMedia, "content is image/bmp"},
		{"truncated png header", validPNG[:20], domain.ErrUnsupportedMedia, "starts like a PNG image but its header is unreadable"},
		{"jpeg magic then garbage", append([]byte{0xff, 0xd8, 0xff}, []byte("garbage")...), domain.ErrUnsupportedMedia, "starts like a JPEG image"},
		{"empty", nil, domain.ErrInvalid, "image is empty"},
		{"too wide", pngBytes(t, media.MaxSide+1, 1), domain.ErrInvalid, "image is 10001x1 pixels; the limit is 10000 a side and 40 megapixels"},
		{"too many pixels", gifScreen(7000, 7000), domain.ErrInvalid, "image is 7000x7000 pixels"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, root := newDir(t)

			_, err := d.Save(t.Context(), bytes.NewReader(tt.data), limit)

			require.ErrorIs(t, err, tt.want)
			assert.Contains(t, err.Error(), tt.message)
			assert.Empty(t, files(t, root), "a rejected upload leaves nothing behind")
		})
	}
}

// TestSaveAcceptsImagesAtTheBound: the largest images by their headers are
// accepted, one pixel more is not (TestSaveRejects).
func TestSaveAcceptsImagesAtTheBound(t *testing.T) {
	d, _ := newDir(t)
	for _, size := range [][2]uint16{{media.MaxSide, media.MaxPixels / media.MaxSide}, {media.MaxPixels / media.MaxSide, media.MaxSide}} {
		img, err := d.Save(t.Context(), bytes.NewReader(gifScreen(size[0], size[1])), limit)
		require.NoError(t, err)
		assert.Equal(t, [2]int{int(size[0]), int(size[1])}, [2]int{img.Width, img.Height})
	}
	_, err := d.Save(t.Context(), bytes.NewReader(gifScreen(media.MaxSide, media.MaxPixels/media.MaxSide+1)), limit)
	require.ErrorIs(t, err, domain.ErrInvalid)
}

func TestSaveSizeLimit(t *testing.T) {
	data := jpegBytes(t, 64, 64)
	size := int64(len(data))

	t.Run("exactly the limit is saved", func(t *testing.T) {
		d, root := newDir(t)
		img, err := d.Save(t.Context(), bytes.NewReader(data), size)
		require.NoError(t, err)
		assert.Equal(t, size, img.Size)
		assert.Len(t, files(t, root), 1)
	})

	t.Run("one byte over the limit is too large", func(t *testing.T) {
		d, root := newDir(t)
		_, err := d.Save(t.Context(), bytes.NewReader(data), size-1)
		require.ErrorIs(t, err, domain.ErrTooLarge)
		assert.Contains(t, err.Error(), "the limit is")
		assert.Empty(t, files(t, root))
	})

	t.Run("reading stops one byte past the limit", func(t *testing.T) {
		d, root := newDir(t)
		body := &countingReader{r: io.MultiReader(bytes.NewReader(data), endless{})}
		_, err := d.Save(t.Context(), body, limit)
		require.ErrorIs(t, err, domain.ErrTooLarge)
		assert.Equal(t, int64(limit+1), body.n)
		assert.Empty(t, files(t, root))
	})
}

func TestSaveStopsWhenContextIsDone(t *testing.T) {
	t.Run("before reading", func(t *testing.T) {
		d, root := newDir(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := d.Save(ctx, bytes.NewReader(pngBytes(t, 2, 2)), limit)
		require.ErrorIs(t, err, context.Canceled)
		assert.Empty(t, files(t, root))
	})

	t.Run("while reading", func(t *testing.T) {
		d, root := newDir(t)
		ctx, cancel := context.WithCancel(t.Context())
		body := &countingReader{r: endless{}, afterFirst: cancel}
		_, err := d.Save(ctx, body, limit)
		require.ErrorIs(t, err, context.Canceled)
		assert.Less(t, body.n, int64(limit), "the copy stopped early")
		assert.Empty(t, files(t, root))
	})
}

// TestSaveWritesTemporaryFilesInTheShards: an upload being written is in a
// first-level shard directory, not the top one, whose lock every create in it
// takes.
func TestSaveWritesTemporaryFilesInTheShards(t *testing.T) {
	d, root := newDir(t)
	var during []string
	body := &countingReader{r: bytes.NewReader(pngBytes(t, 5, 5)), afterFirst: func() { during = files(t, root) }}
	img, err := d.Save(t.Context(), body, limit)
	require.NoError(t, err)
	require.Len(t, during, 1)
	dir, name := path.Split(during[0])
	assert.Regexp(t, `^[0-9a-f]{2}/$`, dir, "the temporary file %s", during[0])
	assert.True(t, strings.HasPrefix(name, ".upload-"), during[0])
	assert.Equal(t, []string{shardPath(img.Key)}, files(t, root), "renamed into place")
}

func TestSaveConcurrentSameImage(t *testing.T) {
	d, root := newDir(t)
	img := saveAtOnce(t, d, gifBytes(t, 20, 20), 8)
	assert.Equal(t, []string{shardPath(img.Key)}, files(t, root))
}

// saveAtOnce saves data n times at once into s, checks that every save
// returned the same image, and returns it.
func saveAtOnce(t *testing.T, s media.Store, data []byte, n int) media.Image {
	t.Helper()
	imgs := make([]media.Image, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			imgs[i], errs[i] = s.Save(t.Context(), bytes.NewReader(data), limit)
		})
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		assert.Equal(t, imgs[0], imgs[i])
	}
	return imgs[0]
}

func TestOpenUnknownOrMalformedKeyIsNotFound(t *testing.T) {
	d, root := newDir(t)
	img, err := d.Save(t.Context(), bytes.NewReader(pngBytes(t, 4, 4)), limit)
	require.NoError(t, err)
	// A file in the store's top directory that a key check must not reach.
	require.NoError(t, os.WriteFile(filepath.Join(root, "plain.png"), []byte("x"), 0o644))

	hexOnly := strings.TrimSuffix(img.Key, ".png")
	keys := []string{
		"",
		"ABC",
		"../../etc/passwd",
		"plain.png",
		hexOnly,
		hexOnly + ".jpg",                  // right hash, wrong type
		strings.ToUpper(hexOnly) + ".png", // upper case
		hexOnly + ".bmp",
		hexOnly + ".png/../" + img.Key,
		hexOnly[:63] + ".png",
		strings.Repeat("0", 64) + ".png",
	}
	for _, key := range keys {
		rc, _, err := d.Open(t.Context(), key)
		if rc != nil {
			_ = rc.Close()
		}
		assert.ErrorIs(t, err, domain.ErrNotFound, "key %q", key)
	}
}

// TestDirRemoveTakesTemporaryFilesToo: Remove also deletes what interrupted
// saves left before the cutoff, and nothing it does not recognise.
func TestDirRemoveTakesTemporaryFilesToo(t *testing.T) {
	d, root := newDir(t)
	kept, err := d.Save(t.Context(), bytes.NewReader(pngBytes(t, 1, 1)), limit)
	require.NoError(t, err)
	orphan, err := d.Save(t.Context(), bytes.NewReader(pngBytes(t, 2, 2)), limit)
	require.NoError(t, err)
	// Left by interrupted saves: in a first-level shard, and (an older
	// version's) in the top directory.
	for _, leftover := range []string{"7f/.upload-456", ".upload-123"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, leftover)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, leftover), []byte("partial"), 0o600))
	}
	// A name like a temporary file's deeper down is not one of them.
	deep := shardPath(kept.Key)[:5] + "/.upload-789"
	require.NoError(t, os.WriteFile(filepath.Join(root, deep), []byte("?"), 0o600))
	unknown := filepath.Join(root, "README")
	require.NoError(t, os.WriteFile(unknown, []byte("operator notes"), 0o644))
	old := time.Now().Add(-2 * time.Hour)
	for _, p := range []string{shardPath(kept.Key), shardPath(orphan.Key), "7f/.upload-456", ".upload-123", deep, "README"} {
		require.NoError(t, os.Chtimes(filepath.Join(root, p), old, old))
	}

	got, err := d.Remove(t.Context(), []string{orphan.Key}, time.Now().Add(-time.Hour))
	require.NoError(t, err)

	assert.Equal(t, media.Reclaimed{Images: 1, Bytes: orphan.Size + 2*int64(len("partial"))}, got)
	want := []string{"README", deep, shardPath(kept.Key)}
	sort.Strings(want)
	assert.Equal(t, want, files(t, root))
}

// endless is a body that never ends.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 0xaa
	}
	return len(p), nil
}

// countingReader counts the bytes read through it and calls afterFirst, if set,
// after the first read.
type countingReader struct {
	r          io.Reader
	n          int64
	afterFirst func()
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.afterFirst != nil {
		c.afterFirst()
		c.afterFirst = nil
	}
	return n, err
}
