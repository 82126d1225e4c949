package http

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
)

func TestWebPageIsServedWithEveryFileItLoads(t *testing.T) {
	a := newTestApp(t)
	a.srv.ServeWebPage(a.auth, DevSignInAbsent)

	page := a.do(t, httptest.NewRequest(fiber.MethodGet, "/", nil))
	require.Equal(t, http.StatusOK, page.status)
	assert.Equal(t, "text/html; charset=utf-8", page.header.Get("Content-Type"))
	csp := page.header.Get("Content-Security-Policy")
	assert.Contains(t, csp, "connect-src 'self'", "the page talks to its own origin only")
	assert.Contains(t, csp, "default-src 'none'")

	// Every file the page names is served, with its type; none is elsewhere.
	refs := regexp.MustCompile(`(?:src|href)="([^"#]+)"`).FindAllStringSubmatch(string(page.raw), -1)
	require.Len(t, refs, 3, "icon, style sheet and script")
	types := map[string]string{".svg": "image/svg+xml", ".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
	for _, m := range refs {
		ref := m[1]
		require.True(t, strings.HasPrefix(ref, "/web/"), "%s is not one of the page's own files", ref)
		f := a.do(t, httptest.NewRequest(fiber.MethodGet, ref, nil))
		require.Equal(t, http.StatusOK, f.status, ref)
		assert.Equal(t, types[ref[strings.LastIndex(ref, "."):]], f.header.Get("Content-Type"), ref)
		assert.NotEmpty(t, f.raw, ref)

		// Revalidated, not fetched again, while it is unchanged.
		req := httptest.NewRequest(fiber.MethodGet, ref, nil)
		req.Header.Set("If-None-Match", f.header.Get("ETag"))
		assert.Equal(t, http.StatusNotModified, a.do(t, req).status, ref)
	}
	missing := a.do(t, httptest.NewRequest(fiber.MethodGet, "/web/nothing.js", nil))
	assert.Equal(t, http.StatusNotFound, missing.status)
	assert.Equal(t, "not_found", missing.errorCode())
}

func TestWebPageIsOffUnlessAsked(t *testing.T) {
	a := newTestApp(t)
	for _, path := range []string{"/", "/web/app.js"} {
		r := a.do(t, httptest.NewRequest(fiber.MethodGet, path, nil))
		assert.Equal(t, http.StatusNotFound, r.status, path)
		assert.Equal(t, "not_found", r.errorCode(), path)
	}
	r := a.command(t, fiber.MethodPost, "/dev/token", 0, `{"user_id": "501"}`)
	assert.Equal(t, http.StatusNotFound, r.status)
}

func TestDevSignIn(t *testing.T) {
	tests := []struct {
		name       string
		signIn     DevSignIn
		body       string
		wantStatus int
		wantCode   string
	}{
		{"open: a token for any user id", DevSignInOpen, `{"user_id": "501"}`, http.StatusOK, ""},
		{"open: not a user id", DevSignInOpen, `{"user_id": "0"}`, http.StatusBadRequest, "invalid_input"},
		{"open: no user id", DevSignInOpen, `{}`, http.StatusBadRequest, "invalid_input"},
		{"open: an unknown field", DevSignInOpen, `{"user_id": "501", "role": "admin"}`, http.StatusBadRequest, "invalid_input"},
		{"refused: the service has a secret of its own", DevSignInRefused, `{"user_id": "501"}`, http.StatusForbidden, "forbidden"},
		{"absent: no such route", DevSignInAbsent, `{"user_id": "501"}`, http.StatusNotFound, "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newTestApp(t)
			a.srv.ServeWebPage(a.auth, tt.signIn)
			r := a.command(t, fiber.MethodPost, "/dev/token", 0, tt.body)
			require.Equal(t, tt.wantStatus, r.status, "body: %s", r.raw)
			if tt.wantCode != "" {
				assert.Equal(t, tt.wantCode, r.errorCode())
				assert.NotEmpty(t, r.errorMessage())
				return
			}
			assert.Equal(t, "no-store", r.header.Get("Cache-Control"))
			p, err := a.auth.Authenticate(r.body["token"].(string))
			require.NoError(t, err)
			assert.Equal(t, Principal{UserID: domain.UserID(501)}, p, "a user's token, never an admin's")
			assert.Equal(t, "501", r.body["user_id"])
			expires, err := time.Parse(time.RFC3339, r.body["expires_at"].(string))
			require.NoError(t, err)
			assert.WithinDuration(t, time.Now().Add(devTokenTTL), expires, time.Minute)

			// The token works on the API's routes.
			req := httptest.NewRequest(fiber.MethodPost, "/users/404/follow", nil)
			req.Header.Set("Authorization", "Bearer "+r.body["token"].(string))
			assert.Equal(t, http.StatusAccepted, a.do(t, req).status)
		})
	}
}
