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
}

var _ Store = (*Dir)(nil)

// tempPrefix starts the names of files still being written. Each is made in
// a first-level shard directory picked at random (the key is known only once
// the file is written), on the same filesystem as its final place, so the
// rename that publishes it is atomic. Not in the top directory: every create
// in one directory takes that directory's lock, and concurrent uploads spun on
// it: under the bench's 500 uploads a second, creating the temporary files
// took 10 of the service's 91 CPU seconds.
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
	published := false
	defer func() {
		_ = tmp.Close() // a second Close after the checked one only returns ErrClosed
		if !published {
			_ = os.Remove(tmp.Name())
		}
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
	final := filepath.Join(dir, img.Key)
	switch _, err := os.Lstat(final); {
	case err == nil:
		// The same bytes are already stored; the temporary file is removed on
		// return. The fresh modification time keeps RemoveOrphans from taking
		// the image before the event of this upload references it.
		now := time.Now()
		if err := os.Chtimes(final, now, now); err != nil {
			return Image{}, fmt.Errorf("save image %s: %w", img.Key, err)
		}
	case errors.Is(err, fs.ErrNotExist):
		err := os.Rename(tmp.Name(), final)
		if errors.Is(err, fs.ErrNotExist) {
			if _, err = d.makeDirs(img.Key[0:2], img.Key[2:4]); err == nil {
				err = os.Rename(tmp.Name(), final)
			}
		}
		if err != nil {
			return Image{}, fmt.Errorf("save image %s: %w", img.Key, err)
		}
		published = true
	default:
		return Image{}, fmt.Errorf("save image %s: %w", img.Key, err)
	}
	// Synced on both paths: a concurrent Save of the same bytes may have renamed
	// the file without having synced its directory yet.
	if err := syncDir(dir); err != nil {
		return Image{}, fmt.Errorf("save image %s: %w", img.Key, err)
	}
	return img, nil
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

// RemoveOrphans deletes the images keep does not claim, and temporary files left
// by interrupted saves, that were last written more than olderThan ago. It
// returns how many files it removed. Images are saved before the events that
// reference them are appended, so olderThan must comfortably exceed the time
// from an upload to its event; files it does not recognise are left alone.
func (d *Dir) RemoveOrphans(ctx context.Context, olderThan time.Duration, keep func(key string) bool) (int, error) {
	cutoff := time.Now().Add(-olderThan)
	removed := 0
	err := filepath.WalkDir(d.path, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !e.Type().IsRegular() {
			return nil
		}
		name := e.Name()
		_, isKey := parseKey(name)
		isKey = isKey && path == d.pathOf(name)
		// Temporary files in the top directory are an older version's.
		parent := filepath.Dir(path)
		isTemp := strings.HasPrefix(name, tempPrefix) && (parent == d.path || filepath.Dir(parent) == d.path)
		if !isKey && !isTemp {
			return nil
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // a save renamed it or another sweep removed it
		}
		if err != nil {
			return err
		}
		if !info.ModTime().Before(cutoff) || (isKey && keep(name)) {
			return nil
		}
		if err := os.Remove(path); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		removed++
		return nil
	})
	if err != nil {
		return removed, fmt.Errorf("remove orphaned images: %w", err)
	}
	return removed, nil
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
