package media

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/feedproject/feed/domain"
)

// Pack is a Store that appends images to pack files under <dir>/packs and
// finds them by an index it keeps in memory, rebuilt from the packs when it
// opens. A file per image costs two fsyncs and a rename into its shard
// directory (decision 38); an append costs a write, and one fdatasync makes
// every image appended before it durable (Sync), however many uploads share
// it: group commit, as the event log's.
//
// Images stored by Dir in the same directory (ab/cd/<key>) are still served.
// One process at a time opens a directory (a lock file says which). Removed
// images leave dead bytes in their pack until it is compacted: its live
// records are copied to the last pack and the file is deleted (Remove).
type Pack struct {
	path   string
	legacy *Dir
	lock   *os.File
	// segmentSize is the size past which appends go to a new pack file.
	segmentSize int64

	// wmu serialises appends, so that records are written in the order of
	// their offsets: a sync that covers one covers every record before it,
	// and a crash can tear only records after the last sync (which NewPack
	// cuts off).
	wmu sync.Mutex
	// mu guards the index, the segments and the unsynced set.
	mu       sync.RWMutex
	index    map[uint64]slot // by the first 8 bytes of the image's SHA-256
	more     map[[sha256.Size]byte]slot
	segments []*segment // by number, nil once compacted; the last is appended to
	unsynced []*segment // written to since the last sync began
	broken   error      // a failed sync: nothing written since is trusted
	// resaved is when images whose bytes were saved again after their
	// record was written were last saved, by their hash.
	resaved map[[sha256.Size]byte]time.Time

	// removing serialises removals and the compactions that follow them.
	removing sync.Mutex

	syncs groupSync
}

var _ Store = (*Pack)(nil)

type segment struct {
	n    int
	f    *os.File
	size int64
	// live is the bytes of the records the index points to; the rest are
	// dead (removed images, copies of records stored twice).
	live int64

	// readers are the readers Open returned that are not closed yet: a
	// compacted segment's file is closed once they are.
	readers   atomic.Int64
	retired   atomic.Bool
	closeOnce sync.Once
}

// release closes the file of a retired segment once no reader needs it.
func (s *segment) release() {
	if s.retired.Load() && s.readers.Load() == 0 {
		s.closeOnce.Do(func() { _ = s.f.Close() })
	}
}

// location is where an image's record is, and what its header says of it.
type location struct {
	offset  int64  // of the record's header
	segment uint32 // in segments
	size    uint32 // of the bytes
	code    byte   // of the format
	saved   int64  // Unix seconds
}

// slot is a location as the index holds it, one for every image stored: the
// segment and the offset, 8 bytes under a key of 8 (the first bytes of the
// image's hash); the record's header has the rest. Images whose hashes share
// their first 8 bytes with another's are in more, by their whole hash.
type slot uint64

func slotOf(l location) slot { return slot(uint64(l.segment)<<32 | uint64(l.offset)) }

func prefix(sum [sha256.Size]byte) uint64 { return binary.LittleEndian.Uint64(sum[:8]) }

// A record is a header and the image's bytes. The header, little-endian:
//
//	0  magic "FMR1"
//	4  format: 1 JPEG, 2 PNG, 3 GIF, 4 WebP
//	5  three zero bytes
//	8  size of the bytes (uint32)
//	12 saved at, Unix seconds (uint64)
//	20 SHA-256 of the bytes
//	52 CRC-32C of the bytes
//	56 CRC-32C of the 56 bytes before it
const (
	recordMagic  = "FMR1"
	headerSize   = 60
	packSuffix   = ".pack"
	packsDir     = "packs"
	lockName     = "lock"
	segmentLimit = 256 << 20
	// maxImage bounds an image, so that a record's size fits its header and
	// every offset in a pack fits a slot's 32 bits.
	maxImage = 1 << 30
	// memoryLimit is how much of an upload is held in memory; a larger one is
	// read into a temporary file first, so that uploads take bounded memory
	// however many arrive at once.
	memoryLimit = 256 << 10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// formatCodes are the record's format bytes, in formats' order from 1.
func formatCode(f format) byte {
	for i, g := range formats {
		if g.ext == f.ext {
			return byte(i + 1)
		}
	}
	return 0
}

// NewPack opens the pack store in path, creating it if missing, and reads the
// index back from its packs. A record torn by a crash can only be at the end
// of the last pack, after everything a Sync covered: it is cut off there.
func NewPack(path string) (*Pack, error) {
	legacy, err := NewDir(path)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(legacy.path, packsDir)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("media packs: %w", err)
	}
	if err := syncDir(legacy.path); err != nil {
		return nil, fmt.Errorf("media packs: %w", err)
	}
	lock, err := lockDir(filepath.Join(dir, lockName))
	if err != nil {
		return nil, err
	}
	p := &Pack{
		path: dir, legacy: legacy, lock: lock, segmentSize: segmentLimit,
		index: map[uint64]slot{}, more: map[[sha256.Size]byte]slot{}, resaved: map[[sha256.Size]byte]time.Time{},
	}
	p.syncs.flush = p.flush
	if err := p.load(); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}

// errClosed is what a store answers once closed (a request that outlived the
// server's shutdown).
var errClosed = errors.New("media store closed")

// Close closes the packs; the store answers errClosed afterwards.
func (p *Pack) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken == nil {
		p.broken = errClosed
	}
	var errs []error
	for _, s := range p.segments {
		if s != nil {
			errs = append(errs, s.f.Close())
		}
	}
	p.segments = nil // what Open reads as closed
	errs = append(errs, p.lock.Close())
	return errors.Join(errs...)
}

// load opens every pack, in order, and indexes its records.
func (p *Pack) load() error {
	entries, err := os.ReadDir(p.path)
	if err != nil {
		return fmt.Errorf("media packs: %w", err)
	}
	var numbers []int
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			// An upload read into a file when the process stopped.
			_ = os.Remove(filepath.Join(p.path, e.Name()))
			continue
		}
		name, ok := strings.CutSuffix(e.Name(), packSuffix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		n, err := strconv.Atoi(name)
		if err != nil || n < 0 {
			continue
		}
		numbers = append(numbers, n)
	}
	slices.Sort(numbers)
	for i, n := range numbers {
		f, err := os.OpenFile(p.segmentPath(n), os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("media pack: %w", err)
		}
		s := &segment{n: n, f: f}
		p.segments = append(p.segments, s)
		if err := p.scan(s, i == len(numbers)-1); err != nil {
			return err
		}
	}
	if len(p.segments) == 0 {
		return p.roll()
	}
	return nil
}

// scan indexes segment s's records. The last segment's bytes are checked too,
// and what follows its last whole record is cut off: an append a crash tore,
// which no Sync covered. Earlier segments were synced whole before the next
// one began, so a bad record in one is damage, not a crash's.
func (p *Pack) scan(s *segment, last bool) error {
	info, err := s.f.Stat()
	if err != nil {
		return fmt.Errorf("media pack %s: %w", s.f.Name(), err)
	}
	end := info.Size()
	var hdr [headerSize]byte
	var off int64
	for off < end {
		loc, sum, err := readRecord(s, off, end, hdr[:], last)
		loc.segment = uint32(len(p.segments) - 1)
		if err != nil {
			if !last {
				return fmt.Errorf("media pack %s is damaged at offset %d: %w", s.f.Name(), off, err)
			}
			if err := s.f.Truncate(off); err != nil {
				return fmt.Errorf("media pack %s: cut a torn record at %d: %w", s.f.Name(), off, err)
			}
			if err := datasync(s.f); err != nil {
				return fmt.Errorf("media pack %s: %w", s.f.Name(), err)
			}
			break
		}
		inserted, err := p.insert(sum, loc)
		if err != nil {
			return err
		}
		if inserted {
			s.live += headerSize + int64(loc.size)
		} else {
			p.resave(sum, savedTime(loc.saved))
		}
		off = loc.offset + headerSize + int64(loc.size)
	}
	s.size = off
	return nil
}

// readRecord reads the record at off of s, which ends at end, checking its
// header, and its bytes if check.
func readRecord(s *segment, off, end int64, hdr []byte, check bool) (location, [sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	if end-off < headerSize {
		return location{}, sum, errors.New("a header cut short")
	}
	if _, err := s.f.ReadAt(hdr, off); err != nil {
		return location{}, sum, err
	}
	if string(hdr[0:4]) != recordMagic || crc32.Checksum(hdr[:56], castagnoli) != binary.LittleEndian.Uint32(hdr[56:]) {
		return location{}, sum, errors.New("not a record header")
	}
	code, size := int(hdr[4]), int64(binary.LittleEndian.Uint32(hdr[8:]))
	if code < 1 || code > len(formats) || off+headerSize+size > end {
		return location{}, sum, errors.New("a record past the end or of no known format")
	}
	copy(sum[:], hdr[20:52])
	loc := location{offset: off, size: uint32(size), code: byte(code), saved: int64(binary.LittleEndian.Uint64(hdr[12:]))}
	if check {
		h := crc32.New(castagnoli)
		if _, err := io.Copy(h, io.NewSectionReader(s.f, off+headerSize, size)); err != nil {
			return location{}, sum, err
		}
		if h.Sum32() != binary.LittleEndian.Uint32(hdr[52:]) {
			return location{}, sum, errors.New("bytes that do not match their checksum")
		}
	}
	return loc, sum, nil
}

func (p *Pack) segmentPath(n int) string {
	return filepath.Join(p.path, fmt.Sprintf("%08d%s", n, packSuffix))
}

// roll starts a new segment. The one before it is synced first, so that only
// the last segment can hold a torn record. Called with wmu held, or while
// loading.
func (p *Pack) roll() error {
	n := 0
	if len(p.segments) > 0 {
		prev := p.segments[len(p.segments)-1]
		if err := datasync(prev.f); err != nil {
			return p.fail(err)
		}
		n = prev.n + 1
	}
	f, err := os.OpenFile(p.segmentPath(n), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("media pack: %w", err)
	}
	if err := syncDir(p.path); err != nil {
		_ = f.Close()
		return fmt.Errorf("media pack: %w", err)
	}
	p.mu.Lock()
	p.segments = append(p.segments, &segment{n: n, f: f})
	p.mu.Unlock()
	return nil
}

// Save implements Store: the image is in the store when it returns, durable
// once a Sync called afterwards returns.
func (p *Pack) Save(ctx context.Context, r io.Reader, maxSize int64) (Image, error) {
	up, img, fm, err := receive(ctx, r, maxSize, headerSize, p.path)
	if err != nil {
		return Image{}, err
	}
	defer up.release()
	if err := p.append(up, fm); err != nil {
		return Image{}, fmt.Errorf("save image %s: %w", img.Key, err)
	}
	return img, nil
}

// append writes up's record to the last segment, unless the same bytes are
// in the store already.
func (p *Pack) append(up *upload, fm format) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	p.mu.RLock()
	if p.broken != nil {
		defer p.mu.RUnlock()
		return p.broken
	}
	_, have, err := p.lookup(up.sum)
	s := p.segments[len(p.segments)-1]
	p.mu.RUnlock()
	if err != nil {
		return err
	}
	if have {
		// Stored, and synced by the Sync that follows this Save if not yet.
		p.mu.Lock()
		p.resave(up.sum, time.Now())
		p.mu.Unlock()
		return nil
	}
	if s.size > 0 && s.size+headerSize+up.size > p.segmentSize {
		if err := p.roll(); err != nil {
			return err
		}
		p.mu.RLock()
		s = p.segments[len(p.segments)-1]
		p.mu.RUnlock()
	}
	var hdr [headerSize]byte
	copy(hdr[0:4], recordMagic)
	hdr[4] = formatCode(fm)
	binary.LittleEndian.PutUint32(hdr[8:], uint32(up.size))
	binary.LittleEndian.PutUint64(hdr[12:], uint64(time.Now().Unix()))
	copy(hdr[20:52], up.sum[:])
	binary.LittleEndian.PutUint32(hdr[52:], up.crc)
	binary.LittleEndian.PutUint32(hdr[56:], crc32.Checksum(hdr[:56], castagnoli))
	if err := p.write(s, hdr[:], up); err != nil {
		// Nothing after s.size is indexed; cut it off so the next append
		// starts where this one did.
		if terr := s.f.Truncate(s.size); terr != nil {
			return p.fail(errors.Join(err, terr))
		}
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.insert(up.sum, location{offset: s.size, segment: uint32(len(p.segments) - 1)}); err != nil {
		return err
	}
	s.size += headerSize + up.size
	s.live += headerSize + up.size
	if !slices.Contains(p.unsynced, s) {
		p.unsynced = append(p.unsynced, s)
	}
	return nil
}

// lookup finds the image whose bytes hash to sum, reading its record's
// header. Called with mu held.
func (p *Pack) lookup(sum [sha256.Size]byte) (location, bool, error) {
	at, ok := p.index[prefix(sum)]
	for ok {
		loc := location{segment: uint32(at >> 32), offset: int64(at & math.MaxUint32)}
		var hdr [headerSize]byte
		if _, err := p.segments[loc.segment].f.ReadAt(hdr[:], loc.offset); err != nil {
			return location{}, false, fmt.Errorf("media pack: %w", err)
		}
		if [sha256.Size]byte(hdr[20:52]) == sum {
			loc.size, loc.code = binary.LittleEndian.Uint32(hdr[8:]), hdr[4]
			loc.saved = int64(binary.LittleEndian.Uint64(hdr[12:]))
			return loc, true, nil
		}
		if next, more := p.more[sum]; more && next != at {
			at = next
		} else {
			ok = false
		}
	}
	return location{}, false, nil
}

// insert indexes the image whose bytes hash to sum at loc, unless it is
// indexed already, and reports whether it did. Called with mu held for
// writing.
func (p *Pack) insert(sum [sha256.Size]byte, loc location) (bool, error) {
	if _, taken := p.index[prefix(sum)]; !taken {
		p.index[prefix(sum)] = slotOf(loc)
		return true, nil
	}
	_, have, err := p.lookup(sum)
	if err == nil && !have {
		p.more[sum] = slotOf(loc)
		return true, nil
	}
	return false, err
}

// write writes a record at the end of s.
func (p *Pack) write(s *segment, hdr []byte, up *upload) error {
	if up.file == nil {
		// One write for the small, usual image.
		rec := up.buf.Bytes()
		copy(rec, hdr)
		_, err := s.f.WriteAt(rec, s.size)
		return err
	}
	if _, err := s.f.WriteAt(hdr, s.size); err != nil {
		return err
	}
	_, err := io.Copy(io.NewOffsetWriter(s.f, s.size+headerSize), io.NewSectionReader(up.file, 0, up.size))
	return err
}

// fail records that a sync failed: the kernel may have dropped what it could
// not write, and a later sync would not say so, so nothing is stored after
// it (the store must be opened again, which checks the last pack).
func (p *Pack) fail(err error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.broken == nil {
		p.broken = fmt.Errorf("media store failed to sync its packs and must be reopened: %w", err)
	}
	return p.broken
}

// Sync implements Store: it returns when every image saved before it was
// called is durable. Concurrent calls share one fdatasync of the packs
// written to.
func (p *Pack) Sync(ctx context.Context) error {
	if err := p.syncs.wait(ctx); err != nil {
		return fmt.Errorf("sync images: %w", err)
	}
	return nil
}

// flush syncs the segments written since the last flush began.
func (p *Pack) flush() error {
	p.mu.Lock()
	todo := p.unsynced
	p.unsynced = nil
	broken := p.broken
	p.mu.Unlock()
	if broken != nil {
		return broken
	}
	for _, s := range todo {
		if err := datasync(s.f); err != nil {
			return p.fail(err)
		}
	}
	return nil
}

// Open implements Store. The reader reads the pack the image is in (it can
// seek); images stored by Dir are opened as Dir opens them.
func (p *Pack) Open(ctx context.Context, key string) (io.ReadCloser, Image, error) {
	fm, err := checkKey(ctx, key)
	if err != nil {
		return nil, Image{}, err
	}
	var sum [sha256.Size]byte
	if _, err := hex.Decode(sum[:], []byte(key[:2*sha256.Size])); err != nil {
		return nil, Image{}, fmt.Errorf("image %q: %w", key, domain.ErrNotFound)
	}
	p.mu.RLock()
	if p.segments == nil { // closed
		p.mu.RUnlock()
		return nil, Image{}, fmt.Errorf("open image %s: %w", key, errClosed)
	}
	loc, have, err := p.lookup(sum)
	var s *segment
	if have {
		s = p.segments[loc.segment]
		s.readers.Add(1)
	}
	p.mu.RUnlock()
	if err != nil {
		return nil, Image{}, fmt.Errorf("open image %s: %w", key, err)
	}
	if !have {
		return p.legacy.open(key, fm)
	}
	r := &packReader{SectionReader: io.NewSectionReader(s.f, loc.offset+headerSize, int64(loc.size)), s: s}
	if loc.code != formatCode(fm) {
		_ = r.Close()
		return nil, Image{}, fmt.Errorf("image %s: %w", key, domain.ErrNotFound)
	}
	return r, Image{Key: key, ContentType: fm.contentType, Size: int64(loc.size)}, nil
}

// packReader reads an image from its segment, whose file stays open until
// it is closed, though the segment be compacted meanwhile.
type packReader struct {
	*io.SectionReader
	s    *segment
	once sync.Once
}

func (r *packReader) Close() error {
	r.once.Do(func() {
		r.s.readers.Add(-1)
		r.s.release()
	})
	return nil
}

// groupSync runs flush for callers of wait, one run at a time, each run for
// every caller that arrived before it began: those that arrive during a run
// share the next.
type groupSync struct {
	flush   func() error
	mu      sync.Mutex
	next    *syncRound
	running bool
}

type syncRound struct {
	done chan struct{}
	err  error
}

func (g *groupSync) wait(ctx context.Context) error {
	g.mu.Lock()
	r := g.next
	if r == nil {
		r = &syncRound{done: make(chan struct{})}
		g.next = r
	}
	if !g.running {
		g.running = true
		go g.run()
	}
	g.mu.Unlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run flushes round after round until none is waiting.
func (g *groupSync) run() {
	for {
		g.mu.Lock()
		r := g.next
		g.next = nil
		if r == nil {
			g.running = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		r.err = g.flush()
		close(r.done)
	}
}
