// Package migrations holds the read model's schema as numbered SQL files
// (golang-migrate's NNNNNN_name.up.sql / .down.sql), embedded in the binary and
// applied at start.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"

	"github.com/golang-migrate/migrate/v4"
	pgxmigrate "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

//go:embed *.sql
var files embed.FS

// Up applies every migration not yet applied to the database at url. Concurrent
// callers (several replicas starting together) are serialised by the migration
// tool's advisory lock.
func Up(ctx context.Context, url string) error {
	m, closeAll, err := open(url)
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

// Version reports the applied schema version and whether a migration failed
// half-way (dirty).
func Version(url string) (uint, bool, error) {
	m, closeAll, err := open(url)
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

func open(url string) (*migrate.Migrate, func(), error) {
	src, err := iofs.New(files, ".")
	if err != nil {
		return nil, nil, fmt.Errorf("open embedded migrations: %w", err)
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, nil, fmt.Errorf("parse database url: %w", err)
	}
	db := stdlib.OpenDB(*cfg)
	driver, err := pgxmigrate.WithInstance(db, &pgxmigrate.Config{MigrationsTable: "schema_migrations"})
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
