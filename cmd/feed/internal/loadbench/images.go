package loadbench

import (
	"bytes"
	"fmt"
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

// postForms prepares n distinct post bodies, each with a caption and one
// side×side PNG of random pixels (random pixels do not compress, so each is
// about 4·side² bytes), so that posting costs the bench no encoding.
func postForms(n, side int, rng *rand.Rand) ([]multipartForm, error) {
	forms := make([]multipartForm, n)
	for i := range forms {
		img, err := noisePNG(side, rng)
		if err != nil {
			return nil, err
		}
		if forms[i], err = postForm(fmt.Sprintf("bench post %d", i), img); err != nil {
			return nil, err
		}
	}
	return forms, nil
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
