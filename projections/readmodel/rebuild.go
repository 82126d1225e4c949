package readmodel

import (
	"context"

	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/pgschema"
)

// schema is the read model's: its live schema, its projector and its
// migrations.
var schema = pgschema.Config{Live: migrations.Schema, Projector: ProjectorName, Migrate: migrations.Up}

// ShadowSchema is the schema a rebuild builds.
var ShadowSchema = schema.Shadow()

// Rebuild is the read model being rebuilt in a shadow schema beside the live
// one (a projections.Shadow; see pgschema.Rebuild).
type Rebuild struct {
	*Projector
	*pgschema.Rebuild
}

// OpenRebuild takes the rebuild lock and opens the shadow: the one an
// interrupted rebuild left, to resume, or a new one when there is none or
// fresh is set.
func OpenRebuild(ctx context.Context, url string, fresh bool, metrics *projections.Metrics) (*Rebuild, error) {
	rb, err := pgschema.OpenRebuild(ctx, url, fresh, schema)
	if err != nil {
		return nil, err
	}
	return &Rebuild{Projector: NewProjector(rb.Pool(), metrics), Rebuild: rb}, nil
}
