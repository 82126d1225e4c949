package http

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/golang-jwt/jwt/v5"
	lru "github.com/hashicorp/golang-lru/v2"

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
	now    func() time.Time
	// verified remembers the tokens that passed, so that a client's next
	// requests with the same token skip the signature and the decoding of its
	// claims (HMAC and two JSON decodes were a tenth of the CPU of a cached
	// GET /feed); their time bounds are checked on every use all the same.
	// Only tokens that passed are kept, so a forger cannot fill it.
	verified *lru.Cache[string, verifiedToken]
}

const (
	// verifiedTokens is how many verified tokens are remembered (a few
	// hundred bytes each): the clients active at once on one instance.
	verifiedTokens = 10_000
	// tokenLeeway is how far the identity provider's clock may be from ours.
	tokenLeeway = 5 * time.Second
)

// verifiedToken is a token whose signature and claims were verified: its
// principal, and the time bounds that every use must still fall within.
type verifiedToken struct {
	principal Principal
	expires   time.Time
	notBefore time.Time // zero: none
}

// check refuses a remembered token outside its time bounds (with
// tokenLeeway), as golang-jwt's parser does for a new one.
func (v verifiedToken) check(now time.Time) error {
	if !now.Before(v.expires.Add(tokenLeeway)) {
		return fmt.Errorf("token expired: %w", domain.ErrUnauthenticated)
	}
	if now.Before(v.notBefore.Add(-tokenLeeway)) {
		return fmt.Errorf("token is not valid yet: %w", domain.ErrUnauthenticated)
	}
	return nil
}

// NewAuthenticator returns an authenticator for secret; now is the clock
// expiry is checked against (nil: the real clock).
func NewAuthenticator(secret string, now func() time.Time) (*Authenticator, error) {
	if len(secret) < 16 {
		return nil, fmt.Errorf("jwt secret has %d bytes; at least 16 are needed: %w", len(secret), domain.ErrInvalid)
	}
	if now == nil {
		now = time.Now
	}
	parser := jwt.NewParser(
		// Only HS256: this also refuses "none" and every asymmetric algorithm a
		// forger might pick to make us verify with the secret as a public key.
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithLeeway(tokenLeeway),
		jwt.WithTimeFunc(now),
	)
	// New fails only for a size below 1.
	verified, _ := lru.New[string, verifiedToken](verifiedTokens)
	return &Authenticator{secret: []byte(secret), parser: parser, now: now, verified: verified}, nil
}

// Authenticate verifies a raw token and returns its principal, or an error
// wrapping domain.ErrUnauthenticated that says what is wrong with it.
func (a *Authenticator) Authenticate(token string) (Principal, error) {
	if v, known := a.verified.Get(token); known {
		if err := v.check(a.now()); err != nil {
			return Principal{}, err
		}
		return v.principal, nil
	}
	v, err := a.verify(token)
	if err != nil {
		return Principal{}, err
	}
	// The token may point into a request buffer that the connection's next
	// request overwrites: the key must be a copy.
	a.verified.Add(strings.Clone(token), v)
	return v.principal, nil
}

// verify checks a token's signature and reads its claims.
func (a *Authenticator) verify(token string) (verifiedToken, error) {
	var c claims
	_, err := a.parser.ParseWithClaims(token, &c, func(*jwt.Token) (any, error) { return a.secret, nil })
	if err != nil {
		return verifiedToken{}, fmt.Errorf("%s: %w", tokenProblem(err), domain.ErrUnauthenticated)
	}
	user, err := domain.ParseUserID(c.Subject)
	if err != nil {
		return verifiedToken{}, fmt.Errorf("token subject is not a user id: %w", domain.ErrUnauthenticated)
	}
	v := verifiedToken{principal: Principal{UserID: user, Admin: c.Role == "admin"}, expires: c.ExpiresAt.Time}
	if c.NotBefore != nil {
		v.notBefore = c.NotBefore.Time
	}
	return v, nil
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
