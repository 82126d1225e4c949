package media_test

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/http/media"
)

// collectable is what collection asks of a store, besides Store.
type collectable interface {
	media.Store
	Images(ctx context.Context, fn func(media.Stored) error) error
	Remove(ctx context.Context, keys []string, cutoff time.Time) (media.Reclaimed, error)
}

// storeKind opens a store in a directory, again after a restart too.
type storeKind struct {
	name string
	open func(t *testing.T, root string) collectable
	// size is how many bytes the store in root takes (default diskBytes).
	size func(t *testing.T, root string) int64
	// readerGrace is how long a removed image's bytes stay for its readers.
	readerGrace time.Duration
}

// objectStores are the JetStream servers of the object stores the tests
// open, by the directory that names them.
var objectStores sync.Map

// objectReaderGrace is the tests' ObjectStoreConfig.ReaderGrace.
const objectReaderGrace = time.Second

func openObjectStore(t *testing.T, root string) *media.ObjectStore {
	t.Helper()
	js, ok := objectStores.Load(root)
	if !ok {
		js = localstacktest.JetStreamForTest(t)
		objectStores.Store(root, js)
		t.Cleanup(func() { objectStores.Delete(root) })
	}
	o, err := media.NewObjectStore(t.Context(), js.(jetstream.JetStream), media.ObjectStoreConfig{
		TempDir: t.TempDir(), ReaderGrace: objectReaderGrace,
	})
	require.NoError(t, err)
	return o
}

// objectStoreBytes is the size of the bucket's stream.
func objectStoreBytes(t *testing.T, root string) int64 {
	t.Helper()
	js, ok := objectStores.Load(root)
	require.True(t, ok)
	s, err := js.(jetstream.JetStream).Stream(t.Context(), "OBJ_"+media.DefaultBucket)
	require.NoError(t, err)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	return int64(info.State.Bytes)
}

var storeKinds = []storeKind{
	{name: "dir", open: func(t *testing.T, root string) collectable {
		d, err := media.NewDir(root)
		require.NoError(t, err)
		return d
	}},
	{name: "pack", open: func(t *testing.T, root string) collectable {
		p, err := media.NewPack(root)
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Close() })
		return p
	}},
	{name: "objectstore", open: func(t *testing.T, root string) collectable { return openObjectStore(t, root) },
		size: objectStoreBytes, readerGrace: objectReaderGrace},
}

func (k storeKind) bytes(t *testing.T, root string) int64 {
	t.Helper()
	if k.size != nil {
		return k.size(t, root)
	}
	return diskBytes(t, root)
}

// TestStoreContract runs the contract of removing images over every store.
func TestStoreContract(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Run("ImagesListsEachImageOnceWithItsTimeOfSaving", func(t *testing.T) { testImagesLists(t, kind) })
			t.Run("RemoveTakesOnlyImagesSavedBeforeTheCutoff", func(t *testing.T) { testRemoveCutoff(t, kind) })
			t.Run("ASaveOfTheSameBytesAfterTheCutoffKeepsTheImage", func(t *testing.T) { testResaveKeeps(t, kind) })
			t.Run("RemoveGivesTheSpaceBack", func(t *testing.T) { testRemoveReclaims(t, kind) })
			t.Run("AnImageOpenedBeforeRemovalReadsWhole", func(t *testing.T) { testOpenReadersSurvive(t, kind) })
			t.Run("SavesRacingRemoveAreKept", func(t *testing.T) { testSavesRacingRemove(t, kind) })
		})
	}
}

func save(t *testing.T, s media.Store, data []byte) media.Image {
	t.Helper()
	img, err := s.Save(t.Context(), bytes.NewReader(data), limit)
	require.NoError(t, err)
	require.NoError(t, s.Sync(t.Context()))
	return img
}

func listed(t *testing.T, s collectable) map[string]media.Stored {
	t.Helper()
	out := map[string]media.Stored{}
	require.NoError(t, s.Images(t.Context(), func(st media.Stored) error {
		_, dup := out[st.Key]
		assert.False(t, dup, "%s listed twice", st.Key)
		out[st.Key] = st
		return nil
	}))
	return out
}

// diskBytes is the size of every file under root.
func diskBytes(t *testing.T, root string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, filepath.WalkDir(root, func(_ string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		info, err := e.Info()
		n += info.Size()
		return err
	}))
	return n
}

func testImagesLists(t *testing.T, kind storeKind) {
	s := kind.open(t, t.TempDir())
	before := time.Now()
	a, b := save(t, s, pngBytes(t, 1, 1)), save(t, s, pngBytes(t, 2, 2))
	save(t, s, pngBytes(t, 1, 1))
	after := time.Now()
	got := listed(t, s)
	require.Len(t, got, 2)
	for _, img := range []media.Image{a, b} {
		st := got[img.Key]
		assert.Equal(t, img.Size, st.Size)
		assert.False(t, st.Saved.Before(before.Truncate(time.Second)), "saved %s, before %s", st.Saved, before)
		assert.False(t, st.Saved.After(after.Add(time.Second)), "saved %s, after %s", st.Saved, after)
	}
}

func testRemoveCutoff(t *testing.T, kind storeKind) {
	s := kind.open(t, t.TempDir())
	a, b := save(t, s, pngBytes(t, 1, 1)), save(t, s, pngBytes(t, 2, 2))
	// Before every save: nothing goes.
	got, err := s.Remove(t.Context(), []string{a.Key, b.Key}, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	assert.Equal(t, 0, got.Images)

	got, err = s.Remove(t.Context(), []string{a.Key, "not-a-key", "../../etc/passwd", keyOf([]byte("absent"), "png")}, time.Now().Add(time.Hour))
	require.NoError(t, err)
	assert.Equal(t, 1, got.Images)
	_, _, err = s.Open(t.Context(), a.Key)
	require.ErrorIs(t, err, domain.ErrNotFound)
	data, _ := readImage(t, s, b.Key)
	assert.Equal(t, pngBytes(t, 2, 2), data)
	assert.NotContains(t, listed(t, s), a.Key)

	// Saved again, it is stored again.
	save(t, s, pngBytes(t, 1, 1))
	data, _ = readImage(t, s, a.Key)
	assert.Equal(t, pngBytes(t, 1, 1), data)
}

func testResaveKeeps(t *testing.T, kind storeKind) {
	s := kind.open(t, t.TempDir())
	again, once := save(t, s, pngBytes(t, 1, 1)), save(t, s, pngBytes(t, 2, 2))
	// Times of saving may be kept in whole seconds, rounded up.
	cutoff := time.Now().Add(time.Second + 10*time.Millisecond)
	time.Sleep(time.Until(cutoff))
	save(t, s, pngBytes(t, 1, 1))

	got, err := s.Remove(t.Context(), []string{again.Key, once.Key}, cutoff)
	require.NoError(t, err)

	assert.Equal(t, 1, got.Images)
	data, _ := readImage(t, s, again.Key)
	assert.Equal(t, pngBytes(t, 1, 1), data)
	_, _, err = s.Open(t.Context(), once.Key)
	assert.ErrorIs(t, err, domain.ErrNotFound)
}

func testRemoveReclaims(t *testing.T, kind storeKind) {
	root := t.TempDir()
	s := kind.open(t, root)
	var live []media.Image
	for i := range 3 {
		live = append(live, save(t, s, noisyPNG(t, 100, uint64(i))))
	}
	size := kind.bytes(t, root)
	var garbage []string
	var garbageBytes int64
	for i := range 8 {
		img := save(t, s, noisyPNG(t, 200, uint64(100+i)))
		garbage, garbageBytes = append(garbage, img.Key), garbageBytes+img.Size
	}
	require.Greater(t, kind.bytes(t, root), size+8*100_000)

	got, err := s.Remove(t.Context(), garbage, time.Now().Add(time.Hour))
	require.NoError(t, err)
	if kind.readerGrace > 0 {
		// The bytes go once no reader may be on them.
		time.Sleep(kind.readerGrace + 10*time.Millisecond)
		later, err := s.Remove(t.Context(), nil, time.Now().Add(time.Hour))
		require.NoError(t, err)
		assert.Equal(t, 0, later.Images)
		got.Bytes += later.Bytes
	}

	assert.Equal(t, 8, got.Images)
	assert.GreaterOrEqual(t, got.Bytes, garbageBytes)
	assert.Equal(t, size, kind.bytes(t, root), "the store is back to its size before")
	check := func(s collectable) {
		for i, img := range live {
			data, _ := readImage(t, s, img.Key)
			assert.Equal(t, noisyPNG(t, 100, uint64(i)), data)
		}
		for _, key := range garbage {
			_, _, err := s.Open(t.Context(), key)
			assert.ErrorIs(t, err, domain.ErrNotFound)
		}
		assert.Len(t, listed(t, s), len(live))
	}
	check(s)
	check(reopen2(t, kind, s, root))
	assert.Equal(t, size, kind.bytes(t, root), "and stays so once opened again")
}

// reopen2 closes s, if it can be, and opens the store in root again.
func reopen2(t *testing.T, kind storeKind, s collectable, root string) collectable {
	t.Helper()
	if c, ok := s.(io.Closer); ok {
		require.NoError(t, c.Close())
	}
	return kind.open(t, root)
}

func testOpenReadersSurvive(t *testing.T, kind storeKind) {
	s := kind.open(t, t.TempDir())
	liveData, goneData := noisyPNG(t, 100, 1), noisyPNG(t, 200, 2)
	live, gone := save(t, s, liveData), save(t, s, goneData)
	liveR, _, err := s.Open(t.Context(), live.Key)
	require.NoError(t, err)
	goneR, _, err := s.Open(t.Context(), gone.Key)
	require.NoError(t, err)

	_, err = s.Remove(t.Context(), []string{gone.Key}, time.Now().Add(time.Hour))
	require.NoError(t, err)

	for r, want := range map[io.ReadCloser][]byte{liveR: liveData, goneR: goneData} {
		got, err := io.ReadAll(r)
		require.NoError(t, err)
		assert.Equal(t, want, got)
		require.NoError(t, r.Close())
	}
	data, _ := readImage(t, s, live.Key)
	assert.Equal(t, liveData, data)
}

func testSavesRacingRemove(t *testing.T, kind storeKind) {
	s := kind.open(t, t.TempDir())
	var keys []string
	var images [][]byte
	for i := range 6 {
		images = append(images, noisyPNG(t, 50, uint64(i)))
		keys = append(keys, save(t, s, images[i]).Key)
	}
	cutoff := time.Now()
	// Every save below is after the cutoff: each image it returns must be
	// stored when both are done, whatever Remove did meanwhile.
	var wg sync.WaitGroup
	saved := make([]bool, len(keys))
	for i := range keys {
		if i%2 == 0 {
			wg.Go(func() {
				for range 5 {
					_, err := s.Save(t.Context(), bytes.NewReader(images[i]), limit)
					assert.NoError(t, err)
				}
				saved[i] = true
			})
		}
	}
	for range 3 {
		_, err := s.Remove(t.Context(), keys, cutoff.Add(-2*time.Second))
		require.NoError(t, err)
		_, err = s.Remove(t.Context(), keys, cutoff)
		require.NoError(t, err)
	}
	wg.Wait()
	for i, key := range keys {
		if saved[i] {
			data, _ := readImage(t, s, key)
			assert.Equal(t, images[i], data)
		}
	}
}
