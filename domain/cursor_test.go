package domain_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
)

func TestCursor(t *testing.T) {
	c, ok, err := domain.ParseCursor("1041:1732899000")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, domain.Cursor{ID: 1041, Unix: 1732899000}, c)
	assert.Equal(t, "1041:1732899000", c.String())

	_, ok, err = domain.ParseCursor("")
	require.NoError(t, err)
	assert.False(t, ok, "no cursor is the first page")

	for _, bad := range []string{"abc", "1041", "1041:", ":17", "0:17", "-1:17", "1041:-5", "1041:1.5",
		"9007199254740992:1", "+5:1", "5:+1", "1:2:3", "1041:1732899000 "} {
		_, _, err := domain.ParseCursor(bad)
		assert.ErrorIs(t, err, domain.ErrInvalid, bad)
	}
}
