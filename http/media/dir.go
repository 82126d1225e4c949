package media

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"image"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/feedproject/feed/domain"
)

// Dir is a Store that keeps images as files under a directory, sharded by the
// key's first two pairs of hex digits (ab/cd/<key>) so no directory grows huge.
// Uploads are written to temporary files and renamed into place, so a key's
// file is either absent or complete.
type Dir struct {
	path string
	// locks make publishing an image and removing it exclusive, by the
	// key's first byte: a Save that finds its bytes stored and renews
	// their time must not be overtaken by a Remove that read the old time.
	locks [256]sync.Mutex
	// uploads holds the temporary files of this process's saves under way,
	// which Remove leaves whatever their time says.
	uploads sync.Map
}

var _ Store = (*Dir)(nil)

// tempPrefix starts the names of files still being written. Each is made in
// a first-level shard directory picked at random (the key is known only once
// the file is written), on the same filesystem as its final place, so the
// rename that publishes it is atomic. Not in the top directory: every create
// in one directory takes that directory's lock, and concurrent uploads would
// spin on it.
const tempPrefix = ".upload-"

// copyBuffers are the buffers uploads are copied through: os.File's ReadFrom
// allocated 32 KiB for every upload.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// sniffLen is how many leading bytes content sniffing looks at.
const sniffLen = 512

// NewDir returns a Dir storing images under path, creating the directory (0755)
// if it is missing.
func NewDir(path string) (*Dir, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("media directory %s: %w", path, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("create media directory: %w", err)
	}
	return &Dir{path: abs}, nil
}

// Save implements Store. It streams r into a temporary file while hashing it,
// so memory use does not grow with the image, and publishes the file under its
// key only after it has been checked and synced.
func (d *Dir) Save(ctx context.Context, r io.Reader, maxSize int64) (Image, error) {
	if maxSize <= 0 {
		return Image{}, fmt.Errorf("save image: size limit %d is not positive", maxSize)
	}
	if err := ctx.Err(); err != nil {
		return Image{}, fmt.Errorf("save image: %w", err)
	}
	// Directories are made when a create or rename finds them missing, not
	// looked up first: a mkdir of one that exists takes its parent's lock too.
	shard := fmt.Sprintf("%02x", rand.IntN(256))
	tmp, err := os.CreateTemp(filepath.Join(d.path, shard), tempPrefix+"*")
	if errors.Is(err, fs.ErrNotExist) {
		var dir string
		if dir, err = d.makeDirs(shard); err == nil {
			tmp, err = os.CreateTemp(dir, tempPrefix+"*")
		}
	}
	if err != nil {
		return Image{}, fmt.Errorf("save image: %w", err)
	}
	d.uploads.Store(tmp.Name(), struct{}{})
	published := false
	defer func() {
		_ = tmp.Close() // a second Close after the checked one only returns ErrClosed
		if !published {
			_ = os.Remove(tmp.Name())
		}
		d.uploads.Delete(tmp.Name())
	}()

	h := sha256.New()
	// One byte over the limit is enough to know the image is too large without
	// reading the rest of it.
	buf := copyBuffers.Get().(*[]byte)
	// The file wrapped, so that the copy goes through buf, not ReadFrom.
	n, err := io.CopyBuffer(struct{ io.Writer }{tmp}, io.TeeReader(io.LimitReader(ctxReader{ctx: ctx, r: r}, maxSize+1), h), *buf)
	copyBuffers.Put(buf)
	if err != nil {
		return Image{}, fmt.Errorf("save image: %w", err)
	}
	if n > maxSize {
		return Image{}, fmt.Errorf("image is %d+ bytes; the limit is %d: %w", n, maxSize, domain.ErrTooLarge)
	}
	if n == 0 {
		return Image{}, fmt.Errorf("image is empty: %w", domain.ErrInvalid)
	}

	fm, cfg, err := inspect(tmp, n)
	if err != nil {
		return Image{}, err
	}
	img := Image{
		Key:         hex.EncodeToString(h.Sum(nil)) + "." + fm.ext,
		ContentType: fm.contentType,
		Width:       cfg.Width,
		Height:      cfg.Height,
		Size:        n,
	}

	if err := tmp.Chmod(0o644); err != nil {
		return Image{}, fmt.Errorf("save image: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		return Image{}, fmt.Errorf("save image: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return Image{}, fmt.Errorf("save image: %w", err)
	}

	dir := filepath.Join(d.path, img.Key[0:2], img.Key[2:4])
	if published, err = d.publish(tmp.Name(), img.Key); err != nil {
		return Image{}, fmt.Errorf("save image %s: %w", img.Key, err)
	}
	// Synced on both paths: a concurrent Save of the same bytes may have renamed
	// the file without having synced its directory yet.
	if err := syncDir(dir); err != nil {
		return Image{}, fmt.Errorf("save image %s: %w", img.Key, err)
	}
	return img, nil
}

// publish puts the written file tmp in place as key, or, when the same bytes
// are stored already, renews their modification time (which Remove reads as
// their last save) and reports that tmp is left over.
func (d *Dir) publish(tmp, key string) (renamed bool, err error) {
	mu := d.lock(key)
	mu.Lock()
	defer mu.Unlock()
	final := d.pathOf(key)
	now := time.Now()
	err = os.Chtimes(final, now, now)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	// The kernel stamps writes with a coarse clock, which can read a few
	// milliseconds behind now: a file published after a cutoff must not
	// look older than it.
	if err := os.Chtimes(tmp, now, now); err != nil {
		return false, err
	}
	err = os.Rename(tmp, final)
	if errors.Is(err, fs.ErrNotExist) {
		if _, err = d.makeDirs(key[0:2], key[2:4]); err == nil {
			err = os.Rename(tmp, final)
		}
	}
	return err == nil, err
}

func (d *Dir) lock(key string) *sync.Mutex {
	b, _ := hex.DecodeString(key[:2]) // a checked key: two hex digits
	return &d.locks[b[0]]
}

// Sync implements Store: Save has synced each image already.
func (d *Dir) Sync(ctx context.Context) error { return ctx.Err() }

// inspect decides the format of the n bytes in f from their content and reads
// its header.
func inspect(f io.ReaderAt, n int64) (format, image.Config, error) {
	head := make([]byte, min(n, sniffLen))
	if _, err := f.ReadAt(head, 0); err != nil {
		return format{}, image.Config{}, fmt.Errorf("save image: %w", err)
	}
	ct := http.DetectContentType(head)
	fm, ok := formatByContentType(ct)
	if !ok {
		ct, _, _ = strings.Cut(ct, ";")
		return format{}, image.Config{}, fmt.Errorf("content is %s, not a JPEG, PNG, GIF or WebP image: %w", ct, domain.ErrUnsupportedMedia)
	}
	cfg, err := fm.decodeConfig(io.NewSectionReader(f, 0, n))
	if err != nil {
		// Not wrapped: for these bytes any failure is a broken header.
		return format{}, image.Config{}, fmt.Errorf("content starts like a %s image but its header is unreadable (%v): %w",
			fm.name, err, domain.ErrUnsupportedMedia)
	}
	if cfg.Width <= 0 || cfg.Height <= 0 {
		return format{}, image.Config{}, fmt.Errorf("%s image is %dx%d pixels, which is empty: %w",
			fm.name, cfg.Width, cfg.Height, domain.ErrUnsupportedMedia)
	}
	if cfg.Width > MaxSide || cfg.Height > MaxSide || int64(cfg.Width)*int64(cfg.Height) > MaxPixels {
		return format{}, image.Config{}, fmt.Errorf("image is %dx%d pixels; the limit is %d a side and %d megapixels: %w",
			cfg.Width, cfg.Height, MaxSide, MaxPixels/1_000_000, domain.ErrInvalid)
	}
	return fm, cfg, nil
}

// Open implements Store. The reader is an *os.File, so callers may seek in it
// (for range requests). Width and Height are left zero: reading them would cost
// every download a header parse.
func (d *Dir) Open(ctx context.Context, key string) (io.ReadCloser, Image, error) {
	fm, err := checkKey(ctx, key)
	if err != nil {
		return nil, Image{}, err
	}
	return d.open(key, fm)
}

// checkKey is what opening key begins with in either store: ctx not done, and
// a well-formed key, whose format it returns.
func checkKey(ctx context.Context, key string) (format, error) {
	if err := ctx.Err(); err != nil {
		return format{}, fmt.Errorf("open image: %w", err)
	}
	fm, ok := parseKey(key)
	if !ok {
		return format{}, fmt.Errorf("image %q: %w", key, domain.ErrNotFound)
	}
	return fm, nil
}

// open opens the file of key, checked already, of format fm.
func (d *Dir) open(key string, fm format) (io.ReadCloser, Image, error) {
	f, err := os.Open(d.pathOf(key))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, Image{}, fmt.Errorf("image %s: %w", key, domain.ErrNotFound)
	}
	if err != nil {
		return nil, Image{}, fmt.Errorf("open image %s: %w", key, err)
	}
	info, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, Image{}, fmt.Errorf("open image %s: %w", key, err)
	}
	if !info.Mode().IsRegular() {
		_ = f.Close()
		return nil, Image{}, fmt.Errorf("image %s: %w", key, domain.ErrNotFound)
	}
	return f, Image{Key: key, ContentType: fm.contentType, Size: info.Size()}, nil
}

// Images calls fn with every image stored, in no particular order; Saved is
// the file's modification time, which a Save of the same bytes renews.
func (d *Dir) Images(ctx context.Context, fn func(Stored) error) error {
	err := filepath.WalkDir(d.path, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if e.IsDir() && path != d.path && len(e.Name()) != 2 {
			return fs.SkipDir // not a shard: the packs
		}
		name := e.Name()
		if _, isKey := parseKey(name); !isKey || !e.Type().IsRegular() || path != d.pathOf(name) {
			return nil
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed meanwhile
		}
		if err != nil {
			return err
		}
		return fn(Stored{Key: name, Size: info.Size(), Saved: info.ModTime()})
	})
	if err != nil {
		return fmt.Errorf("list images: %w", err)
	}
	return nil
}

// Remove deletes the images of keys last saved before cutoff (those saved
// since are kept), and the temporary files of saves interrupted before it.
// Unknown keys are skipped.
func (d *Dir) Remove(ctx context.Context, keys []string, cutoff time.Time) (Reclaimed, error) {
	var r Reclaimed
	for _, key := range keys {
		if err := ctx.Err(); err != nil {
			return r, fmt.Errorf("remove images: %w", err)
		}
		if _, ok := parseKey(key); !ok {
			continue
		}
		n, err := d.remove(key, cutoff)
		if err != nil {
			return r, fmt.Errorf("remove image %s: %w", key, err)
		}
		if n >= 0 {
			r.Images++
			r.Bytes += n
		}
	}
	n, err := d.removeTemporary(cutoff)
	r.Bytes += n
	return r, err
}

// remove deletes key's file if it was last written before cutoff and returns
// its size, or -1 when it kept or found none.
func (d *Dir) remove(key string, cutoff time.Time) (int64, error) {
	mu := d.lock(key)
	mu.Lock()
	defer mu.Unlock()
	path := d.pathOf(key)
	info, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return -1, nil
	}
	if err != nil {
		return -1, err
	}
	if !info.Mode().IsRegular() || !info.ModTime().Before(cutoff) {
		return -1, nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return -1, err
	}
	return info.Size(), nil
}

// removeTemporary deletes the temporary files, in the top directory (an
// older version's) and the first-level shards, last written before cutoff.
func (d *Dir) removeTemporary(cutoff time.Time) (int64, error) {
	dirs := []string{d.path}
	for i := range 256 {
		dirs = append(dirs, filepath.Join(d.path, fmt.Sprintf("%02x", i)))
	}
	var freed int64
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return freed, fmt.Errorf("remove temporary files: %w", err)
		}
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), tempPrefix) || !e.Type().IsRegular() {
				continue
			}
			if _, busy := d.uploads.Load(filepath.Join(dir, e.Name())); busy {
				continue
			}
			info, err := e.Info()
			if err != nil || !info.ModTime().Before(cutoff) {
				continue // gone, or a save under way
			}
			if err := os.Remove(filepath.Join(dir, e.Name())); err == nil {
				freed += info.Size()
			}
		}
	}
	return freed, nil
}

func (d *Dir) pathOf(key string) string {
	return filepath.Join(d.path, key[0:2], key[2:4], key)
}

// makeDirs creates the nested directories names under the top one if needed
// and returns the innermost. Each is synced into its parent so that a renamed
// file cannot be lost with it in a crash, also when it was found made: a
// concurrent save may have made it and not synced it yet.
func (d *Dir) makeDirs(names ...string) (string, error) {
	dir := d.path
	for _, name := range names {
		parent := dir
		dir = filepath.Join(parent, name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", err
		}
		if err := syncDir(parent); err != nil {
			return "", err
		}
	}
	return dir, nil
}

func syncDir(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// ctxReader stops a copy between reads once ctx is done, so an abandoned
// upload does not keep a slow body draining into the store.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
