package http

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/http/media"
)

// Check is one readiness probe: a dependency or a component that must work for the
// service to be worth routing traffic to.
type Check struct {
	Name  string
	Probe func(context.Context) error
	// Role, if set, says what part this process plays in a projector role
	// that several processes run (active or standby), for /readyz's roles.
	Role func() any
}

// Config holds the server's optional knobs; the zero value works.
type Config struct {
	// ProbeTimeout bounds each readiness probe; default 2s.
	ProbeTimeout time.Duration
	// BodyLimit is how many body bytes are buffered before a handler streams the
	// rest; each route enforces its own limit on the whole; default 64 KiB.
	BodyLimit int
	// ReadTimeout bounds the wait for a request's headers, from their first
	// byte, and each wait for more of its body; default 10s.
	ReadTimeout time.Duration
	// ConsistencyWait bounds how long a read waits for its projection to reach
	// the request's X-Min-Position; default 2s.
	ConsistencyWait time.Duration
	// FeedFallbacks is the most reads of the pull feed in Postgres that GET
	// /feed makes at once (a cold inbox, Redis down or slow, a page past the
	// inbox); a read that finds them all under way for a second is answered
	// 503. Default 2: half the read model pool pgx makes on two cores.
	FeedFallbacks int
	// OperationsOnly serves the operations' routes alone (/healthz, /readyz,
	// /metrics, /openapi.yaml and the admin routes, profiles too), not the contract's: a
	// process without the api role. Deps.Media may then be nil.
	OperationsOnly bool
}

func (c Config) withDefaults() Config {
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = 2 * time.Second
	}
	if c.BodyLimit == 0 {
		c.BodyLimit = 64 << 10
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = defaultReadTimeout
	}
	if c.ConsistencyWait == 0 {
		c.ConsistencyWait = 2 * time.Second
	}
	if c.FeedFallbacks <= 0 {
		c.FeedFallbacks = 2
	}
	return c
}

// Deps are what the server needs; all are required but Now.
type Deps struct {
	Logger *slog.Logger
	// Registerer receives the HTTP metrics; Gatherer is what /metrics exposes.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// Checks are the readiness probes of /readyz.
	Checks []Check
	Log    *events.Log
	Media  media.Store
	Auth   *Authenticator
	IDs    *domain.IDGenerator
	// ReadModel answers the read routes; while it is nil they answer 503.
	ReadModel ReadModel
	// FeedCache and FeedModel serve GET /feed; while either is nil it answers 503.
	FeedCache HomeFeedCache
	FeedModel HomeFeedModel
	// FeedPosts hydrates the home feed's pages; nil: FeedModel on every read.
	FeedPosts FeedPosts
	// Activity serves GET /activity; while it is nil it answers 503.
	Activity Activity
	// Rebuilds serves the admin rebuild routes; while it is nil they answer 503.
	Rebuilds Rebuilds
	// MediaCollector serves the admin route that collects unreferenced
	// images; while it is nil it answers 503.
	MediaCollector MediaCollector
	// Streams serves GET /stream; while it is nil it answers 503.
	Streams *Streams
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// keptAnswer is the largest response buffer a connection keeps between its
// requests (fasthttp keeps each connection's at the size of its largest
// answer, for as long as it lives and then in its pool). A home feed page is
// a few kilobytes; a larger answer (/metrics under load, a profile) gives its
// buffer back to the garbage collector rather than leave it with the
// connection: kept, the live heap grew by one with every connection that ever
// carried a scrape.
const keptAnswer = 64 << 10

// The limit is fasthttp's package state, read by every server and client in
// the process, so it is set once, before any of them runs.
func init() { fasthttp.SetBodySizePoolLimit(-1, keptAnswer) }

// Server is the service's HTTP front.
type Server struct {
	app     *fiber.App
	log     *slog.Logger
	cfg     Config
	checks  []Check
	metrics *serverMetrics
	streams *Streams
}

// NewServer builds the app with every route of the contract registered.
func NewServer(deps Deps, cfg Config) *Server {
	cfg = cfg.withDefaults()
	if deps.Now == nil {
		deps.Now = time.Now
	}
	s := &Server{log: deps.Logger, cfg: cfg, checks: deps.Checks, metrics: newServerMetrics(deps.Registerer), streams: deps.Streams}
	s.app = fiber.New(fiber.Config{
		AppName:               "feed",
		DisableStartupMessage: true,
		ErrorHandler:          errorHandler(deps.Logger),
		// Bodies are streamed to the handlers, which enforce each route's limit
		// (see body.go) before anything is held in memory whole; fasthttp
		// buffers at most 8 KiB of a body before handing over the stream.
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		BodyLimit:                    cfg.BodyLimit,
		ReadTimeout:                  cfg.ReadTimeout,
		WriteTimeout:                 time.Minute,
		IdleTimeout:                  2 * time.Minute,
	})
	s.app.Use(recover.New(recover.Config{EnableStackTrace: false}))
	s.app.Use(s.metrics.middleware)
	s.app.Use(guardBodies)
	s.refuseUnknownMethods()
	s.app.Get("/healthz", s.healthz)
	s.app.Get("/readyz", s.readyz)
	s.app.Get("/metrics", adaptor.HTTPHandler(promhttp.HandlerFor(deps.Gatherer, promhttp.HandlerOpts{})))
	s.app.Get("/openapi.yaml", s.openAPI)
	registerProfiling(s.app, deps)
	if cfg.OperationsOnly {
		registerAdmin(s.app, deps)
		return s
	}

	cmd := newCommands(deps)
	auth := deps.Auth.requireAuth
	s.app.Post("/posts", auth, cmd.createPost)
	s.app.Patch("/posts/:id", auth, cmd.editPost)
	s.app.Delete("/posts/:id", auth, cmd.deletePost)
	s.app.Post("/users/:id/follow", noBody, auth, cmd.follow)
	s.app.Delete("/users/:id/follow", auth, cmd.unfollow)
	s.app.Post("/posts/:id/like", noBody, auth, cmd.like)
	s.app.Delete("/posts/:id/like", auth, cmd.unlike)
	s.app.Post("/posts/:id/comments", auth, cmd.comment)
	s.app.Get("/media/:key", cmd.serveMedia)
	registerReads(s.app, deps, cfg)
	registerHomeFeed(s.app, deps, cfg, deps.Registerer)
	registerActivity(s.app, deps, cfg)
	registerStream(s.app, deps)
	registerAdmin(s.app, deps)
	return s
}

// refuseUnknownMethods answers a request whose method Fiber does not know
// (often no HTTP at all: "GARBAGE" as a request line) with the contract's
// error body; Fiber answers those itself, in plain text.
func (s *Server) refuseUnknownMethods() {
	srv := s.app.Server()
	next := srv.Handler
	srv.Handler = func(ctx *fasthttp.RequestCtx) {
		if slices.Contains(fiber.DefaultMethods, string(ctx.Method())) {
			next(ctx)
			return
		}
		ctx.SetConnectionClose()
		c := s.app.AcquireCtx(ctx)
		defer s.app.ReleaseCtx(c)
		err := fmt.Errorf("%q is not an HTTP method: %w", ctx.Method(), domain.ErrInvalid)
		if herr := s.app.ErrorHandler(c, err); herr != nil {
			s.log.Error("answer an unknown method", "err", herr)
		}
	}
}

// App returns the Fiber app, for tests that drive it with app.Test.
func (s *Server) App() *fiber.App { return s.app }

// Serve answers requests on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.app.Listener(ln); err != nil {
		return fmt.Errorf("serve http: %w", err)
	}
	return nil
}

// Shutdown ends the streams, stops accepting connections and waits for
// in-flight requests until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.streams != nil {
		s.streams.Close()
	}
	if err := s.app.ShutdownWithContext(ctx); err != nil {
		return fmt.Errorf("shut down http: %w", err)
	}
	if s.streams != nil {
		// Their connections are the streams' own, which the server does not wait for.
		return s.streams.Wait(ctx)
	}
	return nil
}

func (s *Server) healthz(c *fiber.Ctx) error {
	return c.JSON(fiber.Map{"status": "ok"})
}

// readyz runs every probe concurrently; any failure makes the answer 503 naming
// what failed, so a load balancer stops routing here while it lasts.
func (s *Server) readyz(c *fiber.Ctx) error {
	ctx, cancel := context.WithTimeout(c.UserContext(), s.cfg.ProbeTimeout)
	defer cancel()
	results := make([]error, len(s.checks))
	var wg sync.WaitGroup
	for i, check := range s.checks {
		wg.Go(func() { results[i] = check.Probe(ctx) })
	}
	wg.Wait()
	status := map[string]string{}
	roles := map[string]any{}
	var failed []string
	for i, check := range s.checks {
		if results[i] != nil {
			status[check.Name] = results[i].Error()
			failed = append(failed, check.Name)
			continue
		}
		status[check.Name] = "ok"
		if check.Role != nil {
			roles[check.Name] = check.Role()
		}
	}
	if len(failed) > 0 {
		s.log.Warn("not ready", "failed", failed, "err", errors.Join(results...))
		return fmt.Errorf("not ready: %s: %w", strings.Join(failed, ", "), domain.ErrUnavailable)
	}
	answer := fiber.Map{"status": "ready", "checks": status}
	if len(roles) > 0 {
		answer["roles"] = roles
	}
	return c.JSON(answer)
}

type serverMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newServerMetrics(reg prometheus.Registerer) *serverMetrics {
	m := &serverMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_http_requests_total",
			Help: "HTTP requests, by route pattern, method and status.",
		}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "feed_http_request_seconds",
			Help:    "HTTP request latency, by route pattern and method.",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16),
		}, []string{"route", "method"}),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

func (m *serverMetrics) middleware(c *fiber.Ctx) error {
	start := time.Now()
	err := c.Next()
	if err != nil {
		// Let the error handler write the response now so its status is counted.
		if herr := c.App().ErrorHandler(c, err); herr != nil {
			return herr
		}
	}
	route := c.Route().Path
	// Fiber's method string points into the request buffer, which the next
	// request on the connection overwrites; a label value must outlive it.
	method := strings.Clone(c.Method())
	m.requests.WithLabelValues(route, method, strconv.Itoa(c.Response().StatusCode())).Inc()
	m.duration.WithLabelValues(route, method).Observe(time.Since(start).Seconds())
	return nil
}
