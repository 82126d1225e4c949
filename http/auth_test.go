package http

import (
	"fmt"
	"testing"
	"time"
	"unsafe"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
)

// testClock is a clock a test moves.
type testClock struct{ now time.Time }

func (c *testClock) Now() time.Time { return c.now }

func signTest(t *testing.T, c jwt.MapClaims) string {
	t.Helper()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(testSecret))
	require.NoError(t, err)
	return tok
}

// A remembered token is still checked against the clock on every use.
func TestRememberedTokensKeepTheirTimeBounds(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	for _, tt := range []struct {
		name    string
		claims  jwt.MapClaims
		first   time.Time // accepted then, and so remembered
		later   time.Time // refused then
		problem string
	}{
		{
			name:   "expired since",
			claims: jwt.MapClaims{"sub": "501", "exp": t0.Add(time.Hour).Unix()},
			first:  t0, later: t0.Add(time.Hour + tokenLeeway), problem: "token expired",
		},
		{
			name:   "before its nbf (the clock was set back)",
			claims: jwt.MapClaims{"sub": "501", "exp": t0.Add(time.Hour).Unix(), "nbf": t0.Unix()},
			first:  t0, later: t0.Add(-tokenLeeway - time.Second), problem: "token is not valid yet",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock := &testClock{now: tt.first}
			auth, err := NewAuthenticator(testSecret, clock.Now)
			require.NoError(t, err)
			token := signTest(t, tt.claims)
			p, err := auth.Authenticate(token)
			require.NoError(t, err)
			assert.Equal(t, Principal{UserID: 501}, p)
			require.Equal(t, 1, auth.verified.Len(), "the token is remembered")

			clock.now = tt.later
			_, err = auth.Authenticate(token)
			require.ErrorIs(t, err, domain.ErrUnauthenticated)
			assert.Contains(t, err.Error(), tt.problem)

			clock.now = tt.first
			_, err = auth.Authenticate(token)
			assert.NoError(t, err, "back within its bounds")
		})
	}
}

// The leeway is the same for a token seen for the first time and one
// remembered: accepted until exp + tokenLeeway, refused from then on.
func TestTokenExpiryLeeway(t *testing.T) {
	exp := time.Unix(1_800_000_000, 0)
	token := signTest(t, jwt.MapClaims{"sub": "7", "exp": exp.Unix(), "role": "admin"})
	lastValid := exp.Add(tokenLeeway - time.Nanosecond)
	for _, remembered := range []bool{false, true} {
		clock := &testClock{now: lastValid}
		auth, err := NewAuthenticator(testSecret, clock.Now)
		require.NoError(t, err)
		if remembered {
			clock.now = exp.Add(-time.Hour)
			_, err := auth.Authenticate(token)
			require.NoError(t, err)
			clock.now = lastValid
		}
		p, err := auth.Authenticate(token)
		require.NoError(t, err, "remembered: %v", remembered)
		assert.Equal(t, Principal{UserID: 7, Admin: true}, p)
		clock.now = exp.Add(tokenLeeway)
		_, err = auth.Authenticate(token)
		require.ErrorIs(t, err, domain.ErrUnauthenticated, "remembered: %v", remembered)
	}
}

// Only tokens that passed are remembered, and only so many.
func TestOnlyVerifiedTokensAreRemembered(t *testing.T) {
	now := time.Now()
	auth, err := NewAuthenticator(testSecret, nil)
	require.NoError(t, err)
	forged, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "501", "exp": now.Add(time.Hour).Unix()}).
		SignedString([]byte("another-secret-of-16-bytes!"))
	require.NoError(t, err)
	for name, token := range map[string]string{
		"forged":        forged,
		"malformed":     "not.a.jwt",
		"expired":       signTest(t, jwt.MapClaims{"sub": "501", "exp": now.Add(-time.Minute).Unix()}),
		"not yet valid": signTest(t, jwt.MapClaims{"sub": "501", "exp": now.Add(time.Hour).Unix(), "nbf": now.Add(time.Minute).Unix()}),
		"no exp":        signTest(t, jwt.MapClaims{"sub": "501"}),
		"sub not an id": signTest(t, jwt.MapClaims{"sub": "alice", "exp": now.Add(time.Hour).Unix()}),
	} {
		for range 2 {
			_, err := auth.Authenticate(token)
			require.ErrorIs(t, err, domain.ErrUnauthenticated, name)
		}
		assert.Zero(t, auth.verified.Len(), "%s was remembered", name)
	}

	for i := range verifiedTokens + 10 {
		_, err := auth.Authenticate(signTest(t, jwt.MapClaims{"sub": fmt.Sprint(i + 1), "exp": now.Add(time.Hour).Unix()}))
		require.NoError(t, err)
	}
	assert.Equal(t, verifiedTokens, auth.verified.Len())
}

// A remembered token is keyed by a copy: the string a request hands in points
// into a buffer that the connection's next request overwrites.
func TestRememberedTokenIsACopy(t *testing.T) {
	auth, err := NewAuthenticator(testSecret, nil)
	require.NoError(t, err)
	token := signTest(t, jwt.MapClaims{"sub": "501", "exp": time.Now().Add(time.Hour).Unix()})
	buf := []byte(token)
	_, err = auth.Authenticate(unsafe.String(&buf[0], len(buf)))
	require.NoError(t, err)
	copy(buf, "next request")
	assert.Equal(t, []string{token}, auth.verified.Keys())
}
