// Package migrations holds the Postgres schemas of the read model and of the
// activity as numbered SQL files, embedded and applied at start, each inside a
// Postgres schema of the caller's choice (the live one, or a rebuild's shadow,
// swapped in later).
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/golang-migrate/migrate/v4"
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// The read model's migrations are the files of this directory; the
// activity's, of activity/: a rebuild of one swaps its own schema and leaves
// the other's alone.
var (
	//go:embed *.sql
	files embed.FS
	//go:embed activity/*.sql
	activityFiles embed.FS
)

// Schema is the Postgres schema of the live read model.
const Schema = "readmodel"

// ActivitySchema is the Postgres schema of the live activity.
const ActivitySchema = "activity"

// Up creates schema in the database at url if it is missing and applies every
// read model migration not yet applied inside it. Concurrent callers (several
// replicas starting together) are serialised by the migration tool's
// advisory lock.
func Up(ctx context.Context, url, schema string) error {
	return up(ctx, url, schema, files)
}

// UpActivity is Up for the activity's migrations.
func UpActivity(ctx context.Context, url, schema string) error {
	sub, err := fs.Sub(activityFiles, "activity")
	if err != nil {
		return fmt.Errorf("open embedded activity migrations: %w", err)
	}
	return up(ctx, url, schema, sub)
}

func up(ctx context.Context, url, schema string, src fs.FS) error {
	if err := createSchema(ctx, url, schema); err != nil {
		return err
	}
	m, closeAll, err := open(url, schema, src)
	if err != nil {
		return err
	}
	defer closeAll()
	done := make(chan error, 1)
	go func() { done <- m.Up() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		m.GracefulStop <- true
		err = <-done
	}
	if err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("apply migrations: %w", err)
	}
	return nil
}

// Version reports the read model migration version applied in schema and whether a migration failed
// half-way (dirty).
func Version(url, schema string) (uint, bool, error) {
	m, closeAll, err := open(url, schema, files)
	if err != nil {
		return 0, false, err
	}
	defer closeAll()
	v, dirty, err := m.Version()
	if err != nil && !errors.Is(err, migrate.ErrNilVersion) {
		return 0, false, fmt.Errorf("schema version: %w", err)
	}
	return v, dirty, nil
}

// createSchema creates schema unless it exists; a replica creating it at the
// same moment is not an error.
func createSchema(ctx context.Context, url, schema string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect for migrations: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	_, err = conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{schema}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P06" || pgErr.Code == "23505") {
		return nil // duplicate_schema, or the catalogue's unique index in the race
	}
	if err != nil {
		return fmt.Errorf("create schema %s: %w", schema, err)
	}
	return nil
}

func open(url, schema string, files fs.FS) (*migrate.Migrate, func(), error) {
	src, err := iofs.New(files, ".")
	if err != nil {
		return nil, nil, fmt.Errorf("open embedded migrations: %w", err)
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, nil, fmt.Errorf("parse database url: %w", err)
	}
	cfg.RuntimeParams["search_path"] = schema
	db := stdlib.OpenDB(*cfg)
	driver, err := pgxmigrate.WithInstance(db, &pgxmigrate.Config{MigrationsTable: "schema_migrations", SchemaName: schema})
	if err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("open database for migrations: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	if err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("prepare migrations: %w", err)
	}
	return m, func() { _, _ = m.Close() }, nil
}
