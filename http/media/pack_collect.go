package media

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"slices"
	"time"
)

// deadShare is the share of a pack's bytes that must be dead (1/deadShare)
// before Remove compacts it: copying its live records costs their bytes, so
// a pack a few removals touched is left until more of it is garbage.
const deadShare = 4

// savedTime is a record's time of saving, stored in whole seconds, rounded
// up: an image never seems saved earlier than it was.
func savedTime(unix int64) time.Time { return time.Unix(unix+1, 0) }

// resave records that the image whose bytes hash to sum was saved again at
// at. Called with mu held for writing.
func (p *Pack) resave(sum [sha256.Size]byte, at time.Time) {
	if at.After(p.resaved[sum]) {
		p.resaved[sum] = at
	}
}

// saved is when the image whose bytes hash to sum, found at loc, was last
// saved. Called with mu held.
func (p *Pack) saved(sum [sha256.Size]byte, loc location) time.Time {
	t := savedTime(loc.saved)
	if r, ok := p.resaved[sum]; ok && r.After(t) {
		return r
	}
	return t
}

// Images calls fn with every image stored, in no particular order: those in
// the packs, then those Dir stored in the same directory. An image in both
// is listed twice.
func (p *Pack) Images(ctx context.Context, fn func(Stored) error) error {
	// No compaction moves records while they are listed.
	p.removing.Lock()
	defer p.removing.Unlock()
	p.mu.RLock()
	segs := slices.Clone(p.segments)
	p.mu.RUnlock()
	if segs == nil {
		return fmt.Errorf("list images: %w", errClosed)
	}
	var hdr [headerSize]byte
	for i, s := range segs {
		if s == nil {
			continue
		}
		p.mu.RLock()
		end := s.size
		p.mu.RUnlock()
		for off := int64(0); off < end; {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("list images: %w", err)
			}
			loc, sum, err := readRecord(s, off, end, hdr[:], false)
			if err != nil {
				return fmt.Errorf("list images: media pack %s at offset %d: %w", s.f.Name(), off, err)
			}
			off += headerSize + int64(loc.size)
			p.mu.RLock()
			at, have, err := p.lookup(sum)
			saved := p.saved(sum, loc)
			p.mu.RUnlock()
			if err != nil {
				return fmt.Errorf("list images: %w", err)
			}
			if !have || at.segment != uint32(i) || at.offset != loc.offset {
				continue // dead
			}
			key := hex.EncodeToString(sum[:]) + "." + formats[loc.code-1].ext
			if err := fn(Stored{Key: key, Size: int64(loc.size), Saved: saved}); err != nil {
				return err
			}
		}
	}
	return p.legacy.Images(ctx, fn)
}

// Remove removes the images of keys last saved before cutoff (one saved
// since is kept) and compacts the packs in which at least a quarter of the
// bytes are then dead. Unknown keys are skipped.
func (p *Pack) Remove(ctx context.Context, keys []string, cutoff time.Time) (Reclaimed, error) {
	p.removing.Lock()
	defer p.removing.Unlock()
	var r Reclaimed
	// Appends are held meanwhile: a Save of the same bytes renews their time
	// under wmu, before or after the check, never between it and the removal.
	p.wmu.Lock()
	err := p.unindexOlder(keys, cutoff, &r)
	p.wmu.Unlock()
	if err != nil {
		return r, fmt.Errorf("remove images: %w", err)
	}
	legacy, err := p.legacy.Remove(ctx, keys, cutoff)
	r.Images += legacy.Images
	r.Bytes += legacy.Bytes
	if err != nil {
		return r, err
	}
	freed, err := p.compact(ctx)
	r.Bytes += freed
	if err != nil {
		return r, fmt.Errorf("compact media packs: %w", err)
	}
	return r, nil
}

// unindexOlder takes the images of keys last saved before cutoff out of the
// index. Called with wmu held.
func (p *Pack) unindexOlder(keys []string, cutoff time.Time, r *Reclaimed) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken != nil {
		return p.broken
	}
	for _, key := range keys {
		if _, ok := parseKey(key); !ok {
			continue
		}
		var sum [sha256.Size]byte
		if _, err := hex.Decode(sum[:], []byte(key[:2*sha256.Size])); err != nil {
			continue
		}
		loc, have, err := p.lookup(sum)
		if err != nil {
			return err
		}
		if !have || !p.saved(sum, loc).Before(cutoff) {
			continue
		}
		p.unindex(sum, slotOf(loc))
		p.segments[loc.segment].live -= headerSize + int64(loc.size)
		delete(p.resaved, sum)
		r.Images++
	}
	// A time of saving before cutoff no longer tells an image apart from its
	// record's, which is earlier still.
	for sum, t := range p.resaved {
		if t.Before(cutoff) {
			delete(p.resaved, sum)
		}
	}
	return nil
}

// unindex forgets the image whose bytes hash to sum, indexed at at. Called
// with mu held for writing.
func (p *Pack) unindex(sum [sha256.Size]byte, at slot) {
	k := prefix(sum)
	if s, ok := p.index[k]; ok && s == at {
		delete(p.index, k)
		// Another image of the same prefix moves up from more.
		for other, s := range p.more {
			if prefix(other) == k {
				p.index[k] = s
				delete(p.more, other)
				break
			}
		}
		return
	}
	if s, ok := p.more[sum]; ok && s == at {
		delete(p.more, sum)
	}
}

// reindex moves the image whose bytes hash to sum from one slot to another.
// Called with mu held for writing.
func (p *Pack) reindex(sum [sha256.Size]byte, from, to slot) {
	k := prefix(sum)
	if s, ok := p.index[k]; ok && s == from {
		p.index[k] = to
		return
	}
	if s, ok := p.more[sum]; ok && s == from {
		p.more[sum] = to
	}
}

// compact compacts every pack at least a quarter dead and returns how many
// bytes smaller the packs are.
func (p *Pack) compact(ctx context.Context) (int64, error) {
	p.mu.RLock()
	segs := slices.Clone(p.segments)
	p.mu.RUnlock()
	var freed int64
	for i, s := range segs {
		if s == nil {
			continue
		}
		p.mu.RLock()
		size, dead := s.size, s.size-s.live
		p.mu.RUnlock()
		if dead == 0 || dead*deadShare < size {
			continue
		}
		n, err := p.compactSegment(ctx, i, s)
		freed += n
		if err != nil {
			return freed, err
		}
	}
	return freed, nil
}

// compactSegment copies the live records of s, the i-th segment, to the end
// of the last, makes the copies durable, and deletes s. Appends go on
// meanwhile, between the copies; readers of s keep its file until they
// close.
func (p *Pack) compactSegment(ctx context.Context, i int, s *segment) (int64, error) {
	if err := p.retireLast(s); err != nil {
		return 0, err
	}
	end := s.size // no appends to s any more
	var moved int64
	var hdr [headerSize]byte
	for off := int64(0); off < end; {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		loc, sum, err := readRecord(s, off, end, hdr[:], false)
		if err != nil {
			return 0, fmt.Errorf("media pack %s at offset %d: %w", s.f.Name(), off, err)
		}
		loc.segment = uint32(i)
		n, err := p.relocate(s, sum, loc)
		if err != nil {
			return 0, err
		}
		moved += n
		off += headerSize + int64(loc.size)
	}
	// The copies are durable before the originals go.
	if err := p.Sync(ctx); err != nil {
		return 0, err
	}
	p.wmu.Lock()
	p.mu.Lock()
	p.segments[i] = nil
	p.mu.Unlock()
	p.wmu.Unlock()
	s.retired.Store(true)
	defer s.release()
	if err := os.Remove(s.f.Name()); err != nil {
		return 0, err
	}
	if err := syncDir(p.path); err != nil {
		return 0, err
	}
	return end - moved, nil
}

// retireLast starts a new segment if s is the last, the one appended to.
func (p *Pack) retireLast(s *segment) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.mu.RLock()
	last, broken := s, p.broken
	if broken == nil {
		last = p.segments[len(p.segments)-1]
	}
	p.mu.RUnlock()
	if broken != nil {
		return broken
	}
	if last != s {
		return nil
	}
	return p.roll()
}

// relocate copies the record at loc of s, of the image whose bytes hash to
// sum, to the end of the last segment and points the index at the copy,
// unless the record is dead. It returns the bytes copied.
func (p *Pack) relocate(s *segment, sum [sha256.Size]byte, loc location) (int64, error) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.mu.RLock()
	if p.broken != nil {
		defer p.mu.RUnlock()
		return 0, p.broken
	}
	at, have, err := p.lookup(sum)
	last := p.segments[len(p.segments)-1]
	p.mu.RUnlock()
	if err != nil {
		return 0, err
	}
	if !have || at.segment != loc.segment || at.offset != loc.offset {
		return 0, nil
	}
	rec := headerSize + int64(loc.size)
	if last.size > 0 && last.size+rec > p.segmentSize {
		if err := p.roll(); err != nil {
			return 0, err
		}
		p.mu.RLock()
		last = p.segments[len(p.segments)-1]
		p.mu.RUnlock()
	}
	if _, err := io.Copy(io.NewOffsetWriter(last.f, last.size), io.NewSectionReader(s.f, loc.offset, rec)); err != nil {
		if terr := last.f.Truncate(last.size); terr != nil {
			return 0, p.fail(terr)
		}
		return 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	to := location{segment: uint32(len(p.segments) - 1), offset: last.size}
	p.reindex(sum, slotOf(at), slotOf(to))
	last.size += rec
	last.live += rec
	s.live -= rec
	if !slices.Contains(p.unsynced, last) {
		p.unsynced = append(p.unsynced, last)
	}
	return rec, nil
}
