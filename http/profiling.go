package http

import (
	"fmt"
	"maps"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"

	"github.com/feedproject/feed/domain"
)

// profiles are the runtime's profiles that GET /admin/pprof/{profile} serves,
// each as net/http/pprof serves it (its query parameters too: seconds for
// profile and trace, gc=1 for heap, debug=1 for text).
var profiles = map[string]http.Handler{
	"profile":      http.HandlerFunc(pprof.Profile),
	"trace":        http.HandlerFunc(pprof.Trace),
	"heap":         pprof.Handler("heap"),
	"allocs":       pprof.Handler("allocs"),
	"goroutine":    pprof.Handler("goroutine"),
	"block":        pprof.Handler("block"),
	"mutex":        pprof.Handler("mutex"),
	"threadcreate": pprof.Handler("threadcreate"),
}

// registerProfiling serves the process's runtime profiles to admins: a CPU
// profile or an execution trace of the running service, as its operator runs
// it, rather than of a test build. One route with a path parameter, not
// Fiber's pprof middleware (a prefix that redirects unknown names), so that
// it is documented in openapi.yaml like every route and an unknown profile
// answers 404 in the API's error shape.
func registerProfiling(app *fiber.App, deps Deps) {
	handlers := make(map[string]fiber.Handler, len(profiles))
	for name, h := range profiles {
		handlers[name] = adaptor.HTTPHandler(h)
	}
	app.Get("/admin/pprof/:profile", deps.Auth.requireAdmin, func(c *fiber.Ctx) error {
		name := c.Params("profile")
		h, ok := handlers[name]
		if !ok {
			known := strings.Join(slices.Sorted(maps.Keys(profiles)), ", ")
			return fmt.Errorf("no profile %q (known: %s): %w", name, known, domain.ErrNotFound)
		}
		return h(c)
	})
}
