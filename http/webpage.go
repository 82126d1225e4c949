package http

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/feedproject/feed/domain"
)

// webFiles is the web page: plain HTML, CSS and JavaScript, served as they
// are, so that nothing is built to run it.
//
//go:embed web
var webFiles embed.FS

// DevSignIn is what POST /dev/token does, the web page's development sign-in.
type DevSignIn int

const (
	// DevSignInAbsent leaves the route out: the page then takes a token.
	DevSignInAbsent DevSignIn = iota
	// DevSignInOpen mints a token for any user id: development mode, whose
	// tokens are signed with the development secret.
	DevSignInOpen
	// DevSignInRefused answers 403: development mode with a secret of its own,
	// whose tokens only that secret's owner hands out.
	DevSignInRefused
)

// devTokenTTL is how long a token of the development sign-in lasts.
const devTokenTTL = 24 * time.Hour

// webPageHeaders keep the page to its own origin: it loads and connects to
// nothing else, and no other site may frame it.
var webPageHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; " +
		"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
	"X-Content-Type-Options": "nosniff",
	"Referrer-Policy":        "no-referrer",
}

// webFile is one file of the page, read once.
type webFile struct {
	body        []byte
	contentType string
	etag        string
}

var webContentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

// ServeWebPage adds the web page: GET / and its files under /web/, and the
// development sign-in as signIn says, whose tokens auth signs. Call it
// before Serve.
func (s *Server) ServeWebPage(auth *Authenticator, signIn DevSignIn) {
	files := map[string]webFile{}
	err := fs.WalkDir(webFiles, "web", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := webFiles.ReadFile(p)
		if err != nil {
			return err
		}
		ct, ok := webContentTypes[path.Ext(p)]
		if !ok {
			return fmt.Errorf("web page file %s has no known content type", p)
		}
		sum := sha256.Sum256(body)
		files[path.Base(p)] = webFile{body: body, contentType: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		panic(err) // the embedded files are part of the binary: a programming error
	}
	serve := func(c *fiber.Ctx, name string) error {
		f, ok := files[name]
		if !ok {
			return fmt.Errorf("no file %q in the web page: %w", name, domain.ErrNotFound)
		}
		for k, v := range webPageHeaders {
			c.Set(k, v)
		}
		// Revalidated on every load, so a deploy shows at once.
		c.Set(fiber.HeaderCacheControl, "no-cache")
		c.Set(fiber.HeaderETag, f.etag)
		if c.Get(fiber.HeaderIfNoneMatch) == f.etag {
			return c.SendStatus(fiber.StatusNotModified)
		}
		c.Set(fiber.HeaderContentType, f.contentType)
		return c.Send(f.body)
	}
	s.app.Get("/", func(c *fiber.Ctx) error { return serve(c, "index.html") })
	s.app.Get("/web/:name", func(c *fiber.Ctx) error { return serve(c, c.Params("name")) })

	switch signIn {
	case DevSignInOpen:
		s.app.Post("/dev/token", func(c *fiber.Ctx) error { return devToken(c, auth) })
	case DevSignInRefused:
		s.app.Post("/dev/token", func(*fiber.Ctx) error {
			return fmt.Errorf("development sign-in is off: this service signs its tokens with a secret of its own (FEED_JWT_SECRET); sign in with a token: %w", domain.ErrForbidden)
		})
	}
}

type devTokenBody struct {
	UserID *string `json:"user_id"`
}

// devToken mints a token for the user id of the body.
func devToken(c *fiber.Ctx, auth *Authenticator) error {
	var body devTokenBody
	if err := readJSON(c, &body); err != nil {
		return err
	}
	if body.UserID == nil {
		return fmt.Errorf("user_id is required: %w", domain.ErrInvalid)
	}
	user, err := domain.ParseUserID(*body.UserID)
	if err != nil {
		return err
	}
	now := time.Now()
	token, err := auth.Mint(user, false, now, devTokenTTL)
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(fiber.Map{"token": token, "user_id": user.String(), "expires_at": formatTime(now.Add(devTokenTTL))})
}
