package media_test

import (
	"bytes"
	"context"
	"image"
	"image/color"
	"image/png"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/http/media"
)

func newPack(t *testing.T) (*media.Pack, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "media")
	p, err := media.NewPack(root)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p, root
}

func reopen(t *testing.T, p *media.Pack, root string) *media.Pack {
	t.Helper()
	require.NoError(t, p.Close())
	q, err := media.NewPack(root)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// noisyPNG is a PNG of w×w random pixels, which does not compress: about
// 4w² bytes.
func noisyPNG(t *testing.T, w int, seed uint64) []byte {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	img := image.NewRGBA(image.Rect(0, 0, w, w))
	for x := range w {
		for y := range w {
			img.Set(x, y, color.RGBA{R: uint8(rng.Uint32()), G: uint8(rng.Uint32()), B: uint8(rng.Uint32()), A: 0xff})
		}
	}
	var b bytes.Buffer
	require.NoError(t, png.Encode(&b, img))
	return b.Bytes()
}

func readImage(t *testing.T, s media.Store, key string) ([]byte, media.Image) {
	t.Helper()
	rc, img, err := s.Open(t.Context(), key)
	require.NoError(t, err)
	defer rc.Close()
	got, err := io.ReadAll(rc)
	require.NoError(t, err)
	return got, img
}

// packBytes is the size of every pack file under root.
func packBytes(t *testing.T, root string) int64 {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(root, "packs", "*.pack"))
	require.NoError(t, err)
	var n int64
	for _, p := range paths {
		info, err := os.Stat(p)
		require.NoError(t, err)
		n += info.Size()
	}
	return n
}

func TestPackSavesOpensAndReopens(t *testing.T) {
	p, root := newPack(t)
	large := noisyPNG(t, 300, 1)
	require.Greater(t, len(large), media.MemoryLimit, "the large image goes through a temporary file")
	images := map[string][]byte{
		"jpg":   jpegBytes(t, 40, 30),
		"png":   pngBytes(t, 7, 300),
		"gif":   gifBytes(t, 16, 9),
		"webp":  tinyWebP,
		"large": large,
	}
	saved := map[string]media.Image{}
	for name, data := range images {
		img, err := p.Save(t.Context(), bytes.NewReader(data), limit)
		require.NoError(t, err, name)
		assert.Equal(t, int64(len(data)), img.Size)
		ext := name
		if name == "large" {
			ext = "png"
		}
		assert.Equal(t, keyOf(data, ext), img.Key)
		saved[name] = img
	}
	require.NoError(t, p.Sync(t.Context()))
	assert.Equal(t, []string{"packs/00000000.pack", "packs/lock"}, files(t, root), "no temporary file is left")

	check := func(store *media.Pack) {
		for name, img := range saved {
			got, opened := readImage(t, store, img.Key)
			assert.Equal(t, images[name], got, name)
			assert.Equal(t, img.ContentType, opened.ContentType, name)
			assert.Equal(t, img.Size, opened.Size, name)
		}
	}
	check(p)
	check(reopen(t, p, root))
}

func TestPackStoresTheSameBytesOnce(t *testing.T) {
	p, root := newPack(t)
	data := gifBytes(t, 20, 20)
	saveAtOnce(t, p, data, 8)
	require.NoError(t, p.Sync(t.Context()))
	assert.Equal(t, int64(60+len(data)), packBytes(t, root), "one record of a 60-byte header and the bytes")
}

func TestPackRejectsAndKeepsNothing(t *testing.T) {
	p, root := newPack(t)
	for _, tt := range []struct {
		data  io.Reader
		limit int64
		want  error
	}{
		{strings.NewReader("hello"), limit, domain.ErrUnsupportedMedia},
		{bytes.NewReader(nil), limit, domain.ErrInvalid},
		{bytes.NewReader(pngBytes(t, media.MaxSide+1, 1)), limit, domain.ErrInvalid},
		{bytes.NewReader(gifScreen(7000, 7000)), limit, domain.ErrInvalid},
		{bytes.NewReader(noisyPNG(t, 400, 2)), 300 << 10, domain.ErrTooLarge}, // through a file
		{&countingReader{r: endless{}}, limit, domain.ErrTooLarge},
	} {
		_, err := p.Save(t.Context(), tt.data, tt.limit)
		require.ErrorIs(t, err, tt.want)
	}
	ctx, cancel := context.WithCancel(t.Context())
	_, err := p.Save(ctx, &countingReader{r: endless{}, afterFirst: cancel}, limit)
	require.ErrorIs(t, err, context.Canceled)
	for _, bad := range []int64{0, 2 << 30} {
		_, err := p.Save(t.Context(), bytes.NewReader(pngBytes(t, 2, 2)), bad)
		require.ErrorContains(t, err, "is not between 1 and", "limit %d", bad)
	}

	assert.Zero(t, packBytes(t, root))
	assert.Equal(t, []string{"packs/00000000.pack", "packs/lock"}, files(t, root))
}

// TestPackCutsATornRecord: a crash while appending leaves part of a record at
// the end of the last pack; opening the store cuts it off, and what was synced
// before it is all there.
func TestPackCutsATornRecord(t *testing.T) {
	p, root := newPack(t)
	first := pngBytes(t, 5, 5)
	a, err := p.Save(t.Context(), bytes.NewReader(first), limit)
	require.NoError(t, err)
	require.NoError(t, p.Sync(t.Context()))
	synced := packBytes(t, root)
	b, err := p.Save(t.Context(), bytes.NewReader(pngBytes(t, 6, 6)), limit)
	require.NoError(t, err)
	require.NoError(t, p.Close())

	last := filepath.Join(root, "packs", "00000000.pack")
	for _, cut := range []int64{synced + 10, synced + 61, packBytes(t, root) - 1} {
		require.NoError(t, os.Truncate(last, cut))
		q, err := media.NewPack(root)
		require.NoError(t, err, "cut at %d", cut)
		assert.Equal(t, synced, packBytes(t, root), "the torn record is cut off")
		got, _ := readImage(t, q, a.Key)
		assert.Equal(t, first, got)
		_, _, err = q.Open(t.Context(), b.Key)
		require.ErrorIs(t, err, domain.ErrNotFound)
		require.NoError(t, q.Close())
	}

	// Garbage where the next record would start, and a record whose bytes
	// do not match its checksum, are cut off too.
	q, err := media.NewPack(root)
	require.NoError(t, err)
	_, err = q.Save(t.Context(), bytes.NewReader(pngBytes(t, 6, 6)), limit)
	require.NoError(t, err)
	require.NoError(t, q.Close())
	f, err := os.OpenFile(last, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{0xff}, packBytes(t, root)-1)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	q = reopen(t, mustPack(t, root), root)
	assert.Equal(t, synced, packBytes(t, root))

	c, err := q.Save(t.Context(), bytes.NewReader(gifBytes(t, 3, 3)), limit)
	require.NoError(t, err)
	require.NoError(t, q.Sync(t.Context()))
	q = reopen(t, q, root)
	got, _ := readImage(t, q, a.Key)
	assert.Equal(t, first, got)
	got, _ = readImage(t, q, c.Key)
	assert.Equal(t, gifBytes(t, 3, 3), got)
}

func mustPack(t *testing.T, root string) *media.Pack {
	t.Helper()
	p, err := media.NewPack(root)
	require.NoError(t, err)
	return p
}

// TestPackStartsNewPacks: past the segment size appends go to a new pack;
// damage in a pack before the last is reported, not cut off, since those
// were synced whole.
func TestPackStartsNewPacks(t *testing.T) {
	p, root := newPack(t)
	media.SetSegmentSize(p, 200)
	var keys []string
	for i := range 4 {
		img, err := p.Save(t.Context(), bytes.NewReader(pngBytes(t, 3+i, 3)), limit)
		require.NoError(t, err)
		keys = append(keys, img.Key)
	}
	require.NoError(t, p.Sync(t.Context()))
	packs, err := filepath.Glob(filepath.Join(root, "packs", "*.pack"))
	require.NoError(t, err)
	assert.Len(t, packs, 4, "one record a pack at this size")

	q := reopen(t, p, root)
	for i, key := range keys {
		got, _ := readImage(t, q, key)
		assert.Equal(t, pngBytes(t, 3+i, 3), got)
	}
	require.NoError(t, q.Close())

	require.NoError(t, os.Truncate(packs[1], 30))
	_, err = media.NewPack(root)
	require.ErrorContains(t, err, "00000001.pack is damaged at offset 0")
}

func TestPackServesImagesADirStored(t *testing.T) {
	root := filepath.Join(t.TempDir(), "media")
	d, err := media.NewDir(root)
	require.NoError(t, err)
	data := jpegBytes(t, 8, 8)
	img, err := d.Save(t.Context(), bytes.NewReader(data), limit)
	require.NoError(t, err)

	p := mustPack(t, root)
	defer p.Close()
	got, opened := readImage(t, p, img.Key)
	assert.Equal(t, data, got)
	assert.Equal(t, "image/jpeg", opened.ContentType)
	_, _, err = p.Open(t.Context(), strings.TrimSuffix(img.Key, ".jpg")+".png")
	require.ErrorIs(t, err, domain.ErrNotFound)
}

func TestPackIsOpenInOneProcessAtATime(t *testing.T) {
	p, root := newPack(t)
	_, err := media.NewPack(root)
	require.ErrorContains(t, err, "open in another process")
	reopen(t, p, root)
}

func TestPackOpensOnlyWellFormedKeys(t *testing.T) {
	p, _ := newPack(t)
	img, err := p.Save(t.Context(), bytes.NewReader(pngBytes(t, 4, 4)), limit)
	require.NoError(t, err)
	hexOnly := strings.TrimSuffix(img.Key, ".png")
	for _, key := range []string{"", "../../etc/passwd", hexOnly, hexOnly + ".jpg", strings.ToUpper(hexOnly) + ".png", strings.Repeat("0", 64) + ".png"} {
		_, _, err := p.Open(t.Context(), key)
		assert.ErrorIs(t, err, domain.ErrNotFound, "key %q", key)
	}
}

// TestPackAnswersErrorsOnceClosed: a request that outlives the server's
// shutdown gets an error, not a crash.
func TestPackAnswersErrorsOnceClosed(t *testing.T) {
	p, _ := newPack(t)
	img, err := p.Save(t.Context(), bytes.NewReader(pngBytes(t, 2, 2)), limit)
	require.NoError(t, err)
	require.NoError(t, p.Close())

	_, err = p.Save(t.Context(), bytes.NewReader(pngBytes(t, 3, 3)), limit)
	require.ErrorContains(t, err, "media store closed")
	require.ErrorContains(t, p.Sync(t.Context()), "media store closed")
	_, _, err = p.Open(t.Context(), img.Key)
	require.ErrorContains(t, err, "media store closed")
}

// TestPackCompactsPacksMostlyDead: removals spread over several packs
// compact those at least a quarter dead, moving their live images to the
// last; every live image opens, before and after the store is opened again.
func TestPackCompactsPacksMostlyDead(t *testing.T) {
	p, root := newPack(t)
	media.SetSegmentSize(p, 200_000) // about four images a pack
	var keys []string
	var data [][]byte
	for i := range 16 {
		data = append(data, noisyPNG(t, 100, uint64(i)))
		img, err := p.Save(t.Context(), bytes.NewReader(data[i]), limit)
		require.NoError(t, err)
		keys = append(keys, img.Key)
	}
	require.NoError(t, p.Sync(t.Context()))
	before := packBytes(t, root)
	// One image of the first pack (a quarter or less), every other one of
	// the rest.
	gone := map[int]bool{0: true}
	for i := 5; i < 16; i += 2 {
		gone[i] = true
	}
	var remove []string
	for i := range gone {
		remove = append(remove, keys[i])
	}

	got, err := p.Remove(t.Context(), remove, time.Now().Add(time.Hour))
	require.NoError(t, err)

	assert.Equal(t, len(gone), got.Images)
	assert.Positive(t, got.Bytes)
	assert.Equal(t, before-got.Bytes, packBytes(t, root))
	check := func(p *media.Pack) {
		for i, key := range keys {
			rc, _, err := p.Open(t.Context(), key)
			if gone[i] && i != 0 {
				assert.ErrorIs(t, err, domain.ErrNotFound, "image %d", i)
				continue
			}
			if gone[i] {
				// Its pack was not compacted: it is back once the store
				// opens again, until a removal takes it again.
				if err != nil {
					continue
				}
			}
			require.NoError(t, err, "image %d", i)
			b, err := io.ReadAll(rc)
			require.NoError(t, err)
			require.NoError(t, rc.Close())
			assert.Equal(t, data[i], b, "image %d", i)
		}
	}
	check(p)
	check(reopen(t, p, root))
}
