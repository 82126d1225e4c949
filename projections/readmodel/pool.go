package readmodel

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolConfig configures a pool on the read model in schema (migrations.Schema
// for the live one): unqualified table names resolve in it.
//
// Statements are parsed at each execution instead of prepared once per
// connection (only their result descriptions are cached): a prepared statement
// keeps the tables it was planned on, and a rebuild swaps the tables behind
// the schema's name (see Rebuild) while the pools stay open.
func PoolConfig(url, schema string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	return cfg, nil
}

// OpenPool connects to the read model in schema (see PoolConfig).
func OpenPool(ctx context.Context, url, schema string) (*pgxpool.Pool, error) {
	cfg, err := PoolConfig(url, schema)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect postgres: %w", err)
	}
	return pool, nil
}
