package media

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"image"
	"image/png"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGroupSyncWaitsForARoundThatBeganAfterIt is the group commit's race: a
// caller that arrives while a flush runs may have written after that flush
// took its list, so it must not be answered by it, but by the next.
func TestGroupSyncWaitsForARoundThatBeganAfterIt(t *testing.T) {
	started := make(chan int, 4)
	release := make(chan error)
	round := 0
	g := &groupSync{flush: func() error {
		round++
		started <- round
		return <-release
	}}

	first := make(chan error, 1)
	go func() { first <- g.wait(t.Context()) }()
	require.Equal(t, 1, <-started)

	// Two arrive during the first flush: they share the second.
	second := make(chan error, 2)
	for range 2 {
		go func() { second <- g.wait(t.Context()) }()
	}
	time.Sleep(20 * time.Millisecond) // let them join
	release <- nil
	require.NoError(t, <-first)
	select {
	case err := <-second:
		t.Fatalf("answered by the flush that began before it arrived (%v)", err)
	case <-time.After(20 * time.Millisecond):
	}
	require.Equal(t, 2, <-started)
	failed := errors.New("disk gone")
	release <- failed
	require.ErrorIs(t, <-second, failed)
	require.ErrorIs(t, <-second, failed)

	// Idle again: a caller starts a round of its own.
	done := make(chan error, 1)
	go func() { done <- g.wait(t.Context()) }()
	require.Equal(t, 3, <-started)
	release <- nil
	require.NoError(t, <-done)
}

func TestGroupSyncStopsWaitingWhenTheContextEnds(t *testing.T) {
	release := make(chan struct{})
	g := &groupSync{flush: func() error { <-release; return nil }}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	assert.ErrorIs(t, g.wait(ctx), context.DeadlineExceeded)
	close(release)
}

// TestPackFailsForGoodAfterAFailedSync: after a failed sync the kernel may have
// dropped written pages and a later sync would succeed anyway, so the store
// stores nothing more until it is opened again.
func TestPackFailsForGoodAfterAFailedSync(t *testing.T) {
	p, err := NewPack(t.TempDir())
	require.NoError(t, err)
	defer p.Close()
	p.mu.Lock()
	p.unsynced = append(p.unsynced, &segment{f: p.lock}) // then closed: its sync fails
	p.mu.Unlock()
	require.NoError(t, p.lock.Close())

	require.ErrorContains(t, p.Sync(t.Context()), "must be reopened")
	var img bytes.Buffer
	require.NoError(t, png.Encode(&img, image.NewGray(image.Rect(0, 0, 1, 1))))
	_, err = p.Save(t.Context(), &img, 5<<20)
	require.ErrorContains(t, err, "must be reopened")
	require.ErrorContains(t, p.Sync(t.Context()), "must be reopened")
}

// TestPackTellsImagesApartWhoseHashesStartAlike: the index is keyed by the
// first 8 bytes of a hash; an image whose hash starts like another's is
// indexed by its whole hash, and each opens as itself.
func TestPackTellsImagesApartWhoseHashesStartAlike(t *testing.T) {
	p, err := NewPack(t.TempDir())
	require.NoError(t, err)
	defer p.Close()
	encode := func(w int) []byte {
		var b bytes.Buffer
		require.NoError(t, png.Encode(&b, image.NewGray(image.Rect(0, 0, w, 1))))
		return b.Bytes()
	}
	a, b := encode(1), encode(2)
	imgA, err := p.Save(t.Context(), bytes.NewReader(a), 5<<20)
	require.NoError(t, err)
	// As if b's hash started like a's.
	p.mu.Lock()
	p.index[prefix(sha256.Sum256(b))] = p.index[prefix(sha256.Sum256(a))]
	p.mu.Unlock()

	imgB, err := p.Save(t.Context(), bytes.NewReader(b), 5<<20)
	require.NoError(t, err)
	assert.Len(t, p.more, 1)
	again, err := p.Save(t.Context(), bytes.NewReader(b), 5<<20)
	require.NoError(t, err)
	assert.Equal(t, imgB, again)
	assert.Len(t, p.more, 1, "found, not stored again")
	for key, want := range map[string][]byte{imgA.Key: a, imgB.Key: b} {
		rc, _, err := p.Open(t.Context(), key)
		require.NoError(t, err)
		got, err := io.ReadAll(rc)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
}

// TestPackUnindexesOneOfImagesWhoseHashesStartAlike: forgetting the image
// the index holds by a shared prefix moves the other up from more, and
// either can be moved.
func TestPackUnindexesOneOfImagesWhoseHashesStartAlike(t *testing.T) {
	var a, b [sha256.Size]byte
	a[31], b[31] = 1, 2 // the same first 8 bytes
	p := &Pack{index: map[uint64]slot{prefix(a): 10}, more: map[[sha256.Size]byte]slot{b: 20}}

	p.reindex(b, 20, 21)
	assert.Equal(t, map[[sha256.Size]byte]slot{b: 21}, p.more)
	p.unindex(a, 11) // not where a is: nothing
	assert.Equal(t, map[uint64]slot{prefix(a): 10}, p.index)
	p.unindex(a, 10)

	assert.Equal(t, map[uint64]slot{prefix(a): 21}, p.index)
	assert.Empty(t, p.more)
	p.reindex(b, 21, 0)
	assert.Equal(t, map[uint64]slot{prefix(a): 0}, p.index)
}
