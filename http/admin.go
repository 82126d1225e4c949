package http

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/http/media"
	"github.com/feedproject/feed/projections"
)

// MediaCollector removes the images no post references (the admin route
// that runs a collection now).
type MediaCollector interface {
	Collect(ctx context.Context) (media.Collection, error)
}

// Rebuilds starts projector rebuilds in the background and reports on them
// (the admin routes).
type Rebuilds interface {
	// Start begins rebuilding the named projector ("all": each in turn). It
	// fails with domain.ErrConflict while a rebuild of it runs anywhere and
	// domain.ErrInvalid for an unknown name.
	Start(ctx context.Context, name string, req RebuildRequest) ([]RebuildStatus, error)
	// Status is the latest rebuild of the named projector this process ran, or
	// domain.ErrNotFound.
	Status(name string) (RebuildStatus, error)
}

// RebuildRequest says where a new shadow starts (see projections.ReplayOptions)
// and whether to discard an unfinished one.
type RebuildRequest struct {
	FromSeq uint64
	Since   time.Time
	Fresh   bool
}

// Rebuild states.
const (
	RebuildRunning = "running"
	RebuildDone    = "done"
	RebuildFailed  = "failed"
)

// RebuildStatus is a rebuild's progress and outcome.
type RebuildStatus struct {
	projections.Progress
	State    string     `json:"state"`
	Error    string     `json:"error,omitempty"`
	Finished *time.Time `json:"finished,omitempty"`
}

type admin struct {
	rebuilds  Rebuilds
	collector MediaCollector
	now       func() time.Time
}

func registerAdmin(app *fiber.App, deps Deps) {
	a := &admin{rebuilds: deps.Rebuilds, collector: deps.MediaCollector, now: deps.Now}
	only := deps.Auth.requireAdmin
	app.Post("/admin/rebuild/:projector", noBody, only, a.startRebuild)
	app.Get("/admin/rebuild/:projector", only, a.rebuildStatus)
	app.Post("/admin/media/collect", noBody, only, a.collectMedia)
}

// collectMedia runs a collection of unreferenced images and answers what it
// did.
func (a *admin) collectMedia(c *fiber.Ctx) error {
	if a.collector == nil {
		return fmt.Errorf("media collection is not available in this process (it runs where the api role does): %w", domain.ErrUnavailable)
	}
	col, err := a.collector.Collect(c.UserContext())
	if err != nil {
		return err
	}
	return c.JSON(col)
}

func (a *admin) available() error {
	if a.rebuilds == nil {
		return fmt.Errorf("rebuilds are not available in this process: %w", domain.ErrUnavailable)
	}
	return nil
}

// startRebuild starts a rebuild and answers 202 with where to follow it.
func (a *admin) startRebuild(c *fiber.Ctx) error {
	if err := a.available(); err != nil {
		return err
	}
	req, err := a.rebuildRequest(c)
	if err != nil {
		return err
	}
	name := c.Params("projector")
	started, err := a.rebuilds.Start(context.WithoutCancel(c.UserContext()), name, req)
	if err != nil {
		return err
	}
	c.Location("/admin/rebuild/" + name)
	return c.Status(fiber.StatusAccepted).JSON(fiber.Map{"rebuilds": started})
}

// rebuildRequest reads the optional query parameters from (a log sequence),
// since (a duration back from now, or an RFC 3339 time) and fresh.
func (a *admin) rebuildRequest(c *fiber.Ctx) (RebuildRequest, error) {
	var req RebuildRequest
	if s := c.Query("from"); s != "" {
		seq, err := strconv.ParseUint(s, 10, 64)
		if err != nil || seq == 0 {
			return req, fmt.Errorf("from %q must be a log sequence, 1 or more: %w", s, domain.ErrInvalid)
		}
		req.FromSeq = seq
	}
	if s := c.Query("since"); s != "" {
		if req.FromSeq != 0 {
			return req, fmt.Errorf("give from or since, not both: %w", domain.ErrInvalid)
		}
		if d, err := time.ParseDuration(s); err == nil && d > 0 {
			req.Since = a.now().Add(-d)
		} else if t, err := time.Parse(time.RFC3339, s); err == nil {
			req.Since = t
		} else {
			return req, fmt.Errorf("since %q must be a positive duration such as 1h or an RFC 3339 time: %w", s, domain.ErrInvalid)
		}
	}
	switch s := c.Query("fresh"); s {
	case "", "false":
	case "true":
		req.Fresh = true
	default:
		return req, fmt.Errorf("fresh %q must be true or false: %w", s, domain.ErrInvalid)
	}
	return req, nil
}

func (a *admin) rebuildStatus(c *fiber.Ctx) error {
	if err := a.available(); err != nil {
		return err
	}
	st, err := a.rebuilds.Status(c.Params("projector"))
	if err != nil {
		return err
	}
	return c.JSON(st)
}
