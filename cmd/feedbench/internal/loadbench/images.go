package loadbench

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"image"
	"image/png"
	"math/rand/v2"
	"mime/multipart"
	"net/textproto"
)

// multipartForm is a ready POST /posts body.
type multipartForm struct {
	contentType string
	body        []byte
}

// noiseImages prepares n side×side PNGs of random pixels (random pixels do not
// compress, so each is about 4·side² bytes), so that posting costs the bench no
// encoding.
func noiseImages(n, side int, rng *rand.Rand) ([][]byte, error) {
	imgs := make([][]byte, n)
	for i := range imgs {
		var err error
		if imgs[i], err = noisePNG(side, rng); err != nil {
			return nil, err
		}
	}
	return imgs, nil
}

// uniquePNG returns img with a text chunk numbering it inserted before its last
// chunk (IEND): the same picture in bytes no other post has, as real uploads
// are, so the service stores every post's image rather than finding it stored
// already.
func uniquePNG(img []byte, n uint64) []byte {
	const iendLen = 12 // length, type, CRC; no data
	data := fmt.Appendf([]byte("Comment\x00"), "bench image %d", n)
	chunk := binary.BigEndian.AppendUint32(nil, uint32(len(data)))
	chunk = append(chunk, "tEXt"...)
	chunk = append(chunk, data...)
	chunk = binary.BigEndian.AppendUint32(chunk, crc32.ChecksumIEEE(chunk[4:]))
	out := make([]byte, 0, len(img)+len(chunk))
	out = append(out, img[:len(img)-iendLen]...)
	out = append(out, chunk...)
	return append(out, img[len(img)-iendLen:]...)
}

func noisePNG(side int, rng *rand.Rand) ([]byte, error) {
	img := image.NewNRGBA(image.Rect(0, 0, side, side))
	for i := range img.Pix {
		img.Pix[i] = byte(rng.IntN(256))
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return nil, fmt.Errorf("encode bench image: %w", err)
	}
	return buf.Bytes(), nil
}

func postForm(caption string, img []byte) (multipartForm, error) {
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	if err := w.WriteField("caption", caption); err != nil {
		return multipartForm{}, fmt.Errorf("bench post form: %w", err)
	}
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="images"; filename="bench.png"`)
	h.Set("Content-Type", "image/png")
	part, err := w.CreatePart(h)
	if err != nil {
		return multipartForm{}, fmt.Errorf("bench post form: %w", err)
	}
	if _, err := part.Write(img); err != nil {
		return multipartForm{}, fmt.Errorf("bench post form: %w", err)
	}
	if err := w.Close(); err != nil {
		return multipartForm{}, fmt.Errorf("bench post form: %w", err)
	}
	return multipartForm{contentType: w.FormDataContentType(), body: buf.Bytes()}, nil
}
