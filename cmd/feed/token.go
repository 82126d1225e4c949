package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/feedproject/feed/cmd/internal/stack"
	"github.com/feedproject/feed/domain"
	feedhttp "github.com/feedproject/feed/http"
)

// token mints a development bearer token: users come from an identity provider
// in production, so this exists for local use, scripts and benchmarks.
func token(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	user := fs.String("user", "", "user id (the token's sub claim)")
	admin := fs.Bool("admin", false, "add role: admin (for admin routes)")
	ttl := fs.Duration("ttl", 24*time.Hour, "lifetime of the token")
	if err := fs.Parse(args); err != nil {
		return err
	}
	id, err := domain.ParseUserID(*user)
	if err != nil {
		return fmt.Errorf("%w: --user: %w", errUsage, err)
	}
	if *ttl <= 0 {
		return fmt.Errorf("%w: --ttl must be positive", errUsage)
	}
	cfg, err := stack.Parse(getenv)
	if err != nil {
		return err
	}
	secret, _ := cfg.TokenSecret(true)
	if secret == stack.DevJWTSecret {
		fmt.Fprintln(stderr, "feed token: FEED_JWT_SECRET is unset; signing with the development secret that `feed dev` accepts")
	}
	auth, err := feedhttp.NewAuthenticator(secret, nil)
	if err != nil {
		return fmt.Errorf("FEED_JWT_SECRET: %w", err)
	}
	tok, err := auth.Mint(id, *admin, time.Now(), *ttl)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok)
	return nil
}
