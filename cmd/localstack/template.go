package localstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/feedproject/feed/migrations"
)

// StartPostgresCopy starts a non-durable Postgres in dir (which must not
// exist) with a "feed" database at the current schema, copied from a
// per-process template cluster: only the first call in a process pays for
// initdb and migrations. RemovePostgresTemplate removes the template.
func StartPostgresCopy(ctx context.Context, dir string, log *slog.Logger) (*Postgres, error) {
	tmpl, err := postgresTemplate()
	if err != nil {
		return nil, err
	}
	owner, err := postgresOwner()
	if err != nil {
		return nil, err
	}
	if err := copyTree(tmpl.dataDir, dir, owner); err != nil {
		return nil, fmt.Errorf("copy postgres template cluster: %w", err)
	}
	return StartPostgres(ctx, PostgresConfig{Dir: dir, BinDir: tmpl.binDir}, log)
}

// RemovePostgresTemplate removes this process's template cluster, if any;
// a later StartPostgresCopy builds a fresh one. Without it the template
// (~40MB) stays in os.TempDir until a later process sweeps it.
func RemovePostgresTemplate() {
	templateCache.mu.Lock()
	defer templateCache.mu.Unlock()
	if templateCache.tmpl != nil {
		_ = os.RemoveAll(filepath.Dir(templateCache.tmpl.dataDir))
		templateCache.built, templateCache.tmpl = false, nil
	}
}

// pgTemplate is an initdb'd, never-started cluster that tests copy.
type pgTemplate struct {
	binDir  string
	dataDir string
}

// templateCache holds the per-process Postgres template cluster: initdb
// takes seconds, copying its result takes milliseconds, so only the first
// test in a binary pays for initdb.
//
// This is the package's one process-wide variable, an exception to the
// no-globals rule: the cache must outlive individual tests, and a test
// binary offers no hook to hand it from one test to the next. It lives in a
// pid-named directory under os.TempDir so parallel test processes (go test
// runs packages in separate processes) never share it;
// RemovePostgresTemplate removes it and later processes sweep leftovers of
// dead ones.
var templateCache struct {
	mu    sync.Mutex
	built bool
	tmpl  *pgTemplate
	err   error
}

// postgresTemplate returns the template, building it on first use. A
// failure is remembered too, so a missing binary fails every test quickly
// instead of retrying initdb in each.
func postgresTemplate() (*pgTemplate, error) {
	templateCache.mu.Lock()
	defer templateCache.mu.Unlock()
	if !templateCache.built {
		// Logging is discarded because the first test's logger would be
		// gone when later tests reuse the template.
		templateCache.tmpl, templateCache.err = buildPostgresTemplate(slog.New(slog.DiscardHandler))
		templateCache.built = true
	}
	return templateCache.tmpl, templateCache.err
}

const templatePrefix = "feed-localstack-pgtemplate-"

// buildPostgresTemplate initdb's a cluster into a fresh pid-named directory,
// with the feed database migrated.
func buildPostgresTemplate(log *slog.Logger) (*pgTemplate, error) {
	sweepStaleTemplates()
	bins, err := findPostgresBins("")
	if err != nil {
		return nil, err
	}
	owner, err := postgresOwner()
	if err != nil {
		return nil, err
	}
	root := filepath.Join(os.TempDir(), templatePrefix+strconv.Itoa(os.Getpid()))
	_ = os.RemoveAll(root) // a previous process with our pid
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("postgres template: %w", err)
	}
	if err := os.Chmod(root, 0o755); err != nil { // umask may have narrowed it
		return nil, fmt.Errorf("postgres template: %w", err)
	}
	data := filepath.Join(root, "data")
	if err := prepareDataDir(data, owner); err != nil {
		return nil, fmt.Errorf("postgres template: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := initCluster(ctx, bins, data, owner, false, log); err != nil {
		_ = os.RemoveAll(root)
		return nil, fmt.Errorf("postgres template: %w", err)
	}
	// Start it once to create the feed database at the current schema: every
	// test's copy then starts migrated, and `CREATE DATABASE x TEMPLATE feed`
	// gives a test more migrated databases in milliseconds.
	pg, err := StartPostgres(ctx, PostgresConfig{Dir: data, BinDir: filepath.Dir(bins.postgres)}, log)
	if err != nil {
		_ = os.RemoveAll(root)
		return nil, fmt.Errorf("postgres template: %w", err)
	}
	merr := errors.Join(migrations.Up(ctx, pg.URL(), migrations.Schema),
		migrations.UpActivity(ctx, pg.URL(), migrations.ActivitySchema))
	if err := errors.Join(merr, pg.Stop()); err != nil {
		_ = os.RemoveAll(root)
		return nil, fmt.Errorf("postgres template: migrate: %w", err)
	}
	return &pgTemplate{binDir: filepath.Dir(bins.postgres), dataDir: data}, nil
}

// sweepStaleTemplates removes template directories whose process is gone,
// best effort: a test binary has no exit hook to remove its own.
func sweepStaleTemplates() {
	entries, err := os.ReadDir(os.TempDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		pidStr, ok := strings.CutPrefix(e.Name(), templatePrefix)
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(filepath.Join(os.TempDir(), e.Name()))
		}
	}
}

// copyTree copies the directory src to dst (which must not exist),
// preserving permission bits and handing everything to owner (nil: keep
// ours). Postgres insists on a 0700/0750 data directory owned by the user
// it runs as.
func copyTree(src, dst string, owner *osUser) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, info.Mode().Perm()); err != nil {
				return err
			}
			// Mkdir's mode is filtered by the umask.
			if err := os.Chmod(target, info.Mode().Perm()); err != nil {
				return err
			}
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		case d.Type().IsRegular():
			if err := copyFile(path, target, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			return nil // sockets, fifos: never part of a stopped cluster
		}
		return owner.chown(target)
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	// io.Copy between files uses copy_file_range on Linux, so the ~40MB
	// cluster copies in the kernel.
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(perm); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
