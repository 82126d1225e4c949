// Package media stores the images uploaded with posts under content-addressed keys,
// deciding what each upload is from its bytes rather than its name: only JPEG, PNG,
// GIF and WebP images with a readable header are accepted.
package media

import (
	"context"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"time"

	"golang.org/x/image/webp"
)

// Image is a stored image's metadata, as events carry it.
type Image struct {
	// Key is content-addressed: the lowercase hex SHA-256 of the bytes, a dot and
	// the extension of the type (jpg, png, gif or webp).
	Key string
	// ContentType is image/jpeg, image/png, image/gif or image/webp.
	ContentType string
	// Width and Height are in pixels, read from the image header.
	Width, Height int
	// Size is the number of bytes.
	Size int64
}

// Store is where image bytes live; events carry only keys. It is declared here
// rather than by its users because both the HTTP handlers and cmd's wiring use it;
// an object-store implementation can be added behind it.
type Store interface {
	// Save reads r to its end, at most maxSize bytes, checks that the content is a
	// supported image, stores it atomically under its key and returns its metadata.
	// The image is durable (survives a crash of the machine) once a Sync called
	// after Save returned has returned.
	// Saving the same bytes twice is fine and returns the same Image. More than
	// maxSize bytes is domain.ErrTooLarge, an empty body domain.ErrInvalid, and
	// anything that is not a JPEG, PNG, GIF or WebP image with a readable header
	// domain.ErrUnsupportedMedia.
	Save(ctx context.Context, r io.Reader, maxSize int64) (Image, error)
	// Open returns the bytes stored under key and their metadata (ContentType and
	// Size are set; Width and Height may be zero). Unknown and malformed keys are
	// domain.ErrNotFound. The caller closes the reader.
	Open(ctx context.Context, key string) (io.ReadCloser, Image, error)
	// Sync returns when every image whose Save returned before it was called is
	// durable; nothing may refer to an image before then.
	Sync(ctx context.Context) error
}

// Stored is an image as a store holds it, for collecting those no post
// references.
type Stored struct {
	Key  string
	Size int64
	// Saved is when the image was last saved: a later Save of the same bytes
	// moves it, so that an upload whose post is still on its way to the log
	// is never taken for an old one.
	Saved time.Time
}

// Reclaimed is what a removal of images took from a store.
type Reclaimed struct {
	// Images is how many images were removed.
	Images int
	// Bytes is how much smaller the store's files are.
	Bytes int64
}

// The largest image accepted, by what its header declares: a header can
// claim any size in a few bytes, and every client that shows the image
// allocates for its pixels (40 megapixels are 160 MB decoded).
const (
	// MaxSide is the largest width or height, in pixels.
	MaxSide = 10_000
	// MaxPixels is the largest width × height.
	MaxPixels = 40_000_000
)

// format is one accepted image type. The decoders are called directly rather
// than through image.DecodeConfig so that formats other packages register
// globally can never widen what is accepted.
type format struct {
	contentType  string
	ext          string
	name         string
	decodeConfig func(io.Reader) (image.Config, error)
}

// formats are the accepted image types, in the order their names are listed
// in messages.
var formats = []format{
	{contentType: "image/jpeg", ext: "jpg", name: "JPEG", decodeConfig: jpeg.DecodeConfig},
	{contentType: "image/png", ext: "png", name: "PNG", decodeConfig: png.DecodeConfig},
	{contentType: "image/gif", ext: "gif", name: "GIF", decodeConfig: gif.DecodeConfig},
	{contentType: "image/webp", ext: "webp", name: "WebP", decodeConfig: webp.DecodeConfig},
}

func formatByContentType(ct string) (format, bool) {
	for _, f := range formats {
		if f.contentType == ct {
			return f, true
		}
	}
	return format{}, false
}

// parseKey returns the format of a well-formed key: 64 lowercase hex digits, a
// dot and an accepted extension. Anything else is rejected before it can be
// used as a path.
func parseKey(key string) (format, bool) {
	const hexLen = 64
	if len(key) < hexLen+2 || key[hexLen] != '.' {
		return format{}, false
	}
	for i := range hexLen {
		c := key[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return format{}, false
		}
	}
	ext := key[hexLen+1:]
	for _, f := range formats {
		if f.ext == ext {
			return f, true
		}
	}
	return format{}, false
}
