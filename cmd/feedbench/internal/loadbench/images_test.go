package loadbench

import (
	"bytes"
	"image/png"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUniquePNGIsTheSamePictureInOtherBytes: every post's image must be bytes
// of its own (else the service finds it stored already and the bench measures
// that shortcut), and still a PNG the service accepts, of the same picture.
func TestUniquePNGIsTheSamePictureInOtherBytes(t *testing.T) {
	imgs, err := noiseImages(1, 24, rand.New(rand.NewPCG(1, 2)))
	require.NoError(t, err)
	base, err := png.Decode(bytes.NewReader(imgs[0]))
	require.NoError(t, err)

	a, b := uniquePNG(imgs[0], 1), uniquePNG(imgs[0], 2)
	assert.NotEqual(t, a, b)
	assert.NotEqual(t, imgs[0], a)
	for _, img := range [][]byte{a, b} {
		got, err := png.Decode(bytes.NewReader(img))
		require.NoError(t, err, "a valid PNG: chunk CRCs and order are right")
		assert.Equal(t, base, got)
	}
}
