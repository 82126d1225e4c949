package readmodel

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolConfig configures a pool on the read model in schema (migrations.Schema
// for the live one): unqualified table names resolve in it.
//
// A rebuild swaps the tables behind the schema's name while pools stay open
// (see Rebuild). Their prepared statements follow: Postgres drops every cached
// plan when a schema changes, and the next execution looks the names up again
// (TestRebuildDuringLiveTraffic fails if they do not).
func PoolConfig(url, schema string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	return cfg, nil
}

// OpenPool connects to the read model in schema (see PoolConfig) with at
// most maxConns connections; 0 leaves the url's pool_max_conns or pgx's
// default.
func OpenPool(ctx context.Context, url, schema string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := PoolConfig(url, schema)
	if err != nil {
		return nil, err
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect postgres: %w", err)
	}
	return pool, nil
}
