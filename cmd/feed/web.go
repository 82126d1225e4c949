package main

import (
	"github.com/feedproject/feed/cmd/internal/stack"
	feedhttp "github.com/feedproject/feed/http"
)

// devSignIn is the web page's development sign-in: only in development mode,
// and there only while tokens are signed with the development secret, which
// anyone may sign with anyway (feed token).
func devSignIn(cfg stack.Config, dev bool) feedhttp.DevSignIn {
	switch {
	case !dev:
		return feedhttp.DevSignInAbsent
	case cfg.JWTSecret != "":
		return feedhttp.DevSignInRefused
	default:
		return feedhttp.DevSignInOpen
	}
}
