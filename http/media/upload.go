package media

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync"

	"github.com/feedproject/feed/domain"
)

// upload is an image as received: in memory, or in a temporary file when
// larger than memoryLimit, so that uploads take bounded memory however many
// arrive at once.
type upload struct {
	buf *bytes.Buffer
	// room is how many bytes buf holds before the image's: a pack writes
	// its record's header there.
	room int
	file *os.File
	size int64
	sum  [sha256.Size]byte
	crc  uint32
}

var uploadBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (u *upload) content() io.ReaderAt {
	if u.file != nil {
		return u.file
	}
	return bytes.NewReader(u.data())
}

// data is an upload's bytes held in memory, after the room.
func (u *upload) data() []byte { return u.buf.Bytes()[u.room:] }

func (u *upload) release() {
	if u.file != nil {
		_ = u.file.Close()
		_ = os.Remove(u.file.Name())
	}
	if u.buf != nil && u.buf.Cap() <= 2*memoryLimit {
		u.buf.Reset()
		uploadBuffers.Put(u.buf)
	}
	u.buf, u.file = nil, nil
}

// receive reads r to its end, or one byte past maxSize, hashing it, into
// memory after room bytes, or past memoryLimit into a temporary file in
// tempDir; then checks it is an accepted image (inspect). Every store saves
// through it, so that limits, sniffing and keys are the same in each. The
// caller releases the upload.
func receive(ctx context.Context, r io.Reader, maxSize int64, room int, tempDir string) (*upload, Image, format, error) {
	if maxSize <= 0 || maxSize > maxImage {
		return nil, Image{}, format{}, fmt.Errorf("save image: size limit %d is not between 1 and %d", maxSize, maxImage)
	}
	if err := ctx.Err(); err != nil {
		return nil, Image{}, format{}, fmt.Errorf("save image: %w", err)
	}
	up := &upload{buf: uploadBuffers.Get().(*bytes.Buffer), room: room}
	up.buf.Write(make([]byte, room))
	sha, crc := sha256.New(), crc32.New(castagnoli)
	src := io.TeeReader(io.LimitReader(ctxReader{ctx: ctx, r: r}, maxSize+1), io.MultiWriter(sha, crc))
	n, err := up.buf.ReadFrom(io.LimitReader(src, memoryLimit))
	if err == nil && n == memoryLimit {
		// Larger than memory takes: the rest into a temporary file, with what
		// was read.
		if up.file, err = os.CreateTemp(tempDir, tempPrefix+"*"); err == nil {
			if _, err = up.file.Write(up.data()); err == nil {
				var more int64
				more, err = io.Copy(struct{ io.Writer }{up.file}, src)
				n += more
			}
		}
	}
	up.size = n
	switch {
	case err != nil:
		err = fmt.Errorf("save image: %w", err)
	case n > maxSize:
		err = fmt.Errorf("image is %d+ bytes; the limit is %d: %w", n, maxSize, domain.ErrTooLarge)
	case n == 0:
		err = fmt.Errorf("image is empty: %w", domain.ErrInvalid)
	}
	if err != nil {
		up.release()
		return nil, Image{}, format{}, err
	}
	copy(up.sum[:], sha.Sum(nil))
	up.crc = crc.Sum32()
	fm, cfg, err := inspect(up.content(), up.size)
	if err != nil {
		up.release()
		return nil, Image{}, format{}, err
	}
	img := Image{
		Key:         hex.EncodeToString(up.sum[:]) + "." + fm.ext,
		ContentType: fm.contentType,
		Width:       cfg.Width,
		Height:      cfg.Height,
		Size:        up.size,
	}
	return up, img, fm, nil
}
