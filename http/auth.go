package http

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/golang-jwt/jwt/v5"

	"github.com/feedproject/feed/domain"
)

// Principal is the authenticated caller of a request.
type Principal struct {
	UserID domain.UserID
	Admin  bool
}

// claims are the token claims the service reads: sub (the user id), exp
// (required) and an optional role.
type claims struct {
	Role string `json:"role,omitempty"`
	jwt.RegisteredClaims
}

// Authenticator verifies HS256 bearer tokens issued with a shared secret.
type Authenticator struct {
	secret []byte
	parser *jwt.Parser
}

// NewAuthenticator returns an authenticator for secret; now is the clock
// expiry is checked against (nil: the real clock).
func NewAuthenticator(secret string, now func() time.Time) (*Authenticator, error) {
	if len(secret) < 16 {
		return nil, fmt.Errorf("jwt secret has %d bytes; at least 16 are needed: %w", len(secret), domain.ErrInvalid)
	}
	opts := []jwt.ParserOption{
		// Only HS256: this also refuses "none" and every asymmetric algorithm a
		// forger might pick to make us verify with the secret as a public key.
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(5 * time.Second),
	}
	if now != nil {
		opts = append(opts, jwt.WithTimeFunc(now))
	}
	return &Authenticator{secret: []byte(secret), parser: jwt.NewParser(opts...)}, nil
}

// Authenticate verifies a raw token and returns its principal, or an error
// wrapping domain.ErrUnauthenticated that says what is wrong with it.
func (a *Authenticator) Authenticate(token string) (Principal, error) {
	var c claims
	_, err := a.parser.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return a.secret, nil })
	if err != nil {
		return Principal{}, fmt.Errorf("%s: %w", tokenProblem(err), domain.ErrUnauthenticated)
	}
	user, err := domain.ParseUserID(c.Subject)
	if err != nil {
		return Principal{}, fmt.Errorf("token subject is not a user id: %w", domain.ErrUnauthenticated)
	}
	return Principal{UserID: user, Admin: c.Role == "admin"}, nil
}

func tokenProblem(err error) string {
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return "token expired"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return "token lacks a required claim (exp)"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable):
		return "token signature is invalid"
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return "token is not valid yet"
	default:
		return "token is malformed"
	}
}

// Mint issues a token for user valid for ttl from now, for development and
// tests (users come from an identity provider in production).
func (a *Authenticator) Mint(user domain.UserID, admin bool, now time.Time, ttl time.Duration) (string, error) {
	c := claims{RegisteredClaims: jwt.RegisteredClaims{
		Subject:   user.String(),
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}}
	if admin {
		c.Role = "admin"
	}
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(a.secret)
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return token, nil
}

const principalKey = "feed.principal"

// bearer extracts the token of an Authorization header; ok is false when there
// is no header at all.
func bearer(c *fiber.Ctx) (token string, ok bool, err error) {
	h := c.Get(fiber.HeaderAuthorization)
	if h == "" {
		return "", false, nil
	}
	scheme, token, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return "", true, fmt.Errorf("authorization header is not \"Bearer <token>\": %w", domain.ErrUnauthenticated)
	}
	return strings.TrimSpace(token), true, nil
}

// fromRequest authenticates the request's bearer token, if it has one; a token
// that is sent must be valid.
func (a *Authenticator) fromRequest(c *fiber.Ctx) (Principal, bool, error) {
	token, ok, err := bearer(c)
	if err != nil || !ok {
		return Principal{}, false, err
	}
	p, err := a.Authenticate(token)
	if err != nil {
		return Principal{}, false, err
	}
	c.Locals(principalKey, p)
	return p, true, nil
}

// requireAuth admits only requests with a valid token.
func (a *Authenticator) requireAuth(c *fiber.Ctx) error { return a.require(c, false) }

// requireAdmin admits only requests whose token has the admin role.
func (a *Authenticator) requireAdmin(c *fiber.Ctx) error { return a.require(c, true) }

func (a *Authenticator) require(c *fiber.Ctx, admin bool) error {
	p, ok, err := a.fromRequest(c)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("a bearer token is required: %w", domain.ErrUnauthenticated)
	}
	if admin && !p.Admin {
		return fmt.Errorf("admin routes need a token with the admin role: %w", domain.ErrForbidden)
	}
	return c.Next()
}

// principal returns the caller; ok is false for an anonymous request.
func principal(c *fiber.Ctx) (Principal, bool) {
	p, ok := c.Locals(principalKey).(Principal)
	return p, ok
}
