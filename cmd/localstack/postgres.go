package localstack

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	postgresReadyTimeout = 30 * time.Second
	postgresStopGrace    = 15 * time.Second
	// postgresOSUser is who runs initdb and postgres when we are root:
	// both refuse to run as root, and Debian's package creates this user.
	postgresOSUser = "postgres"
	// maxUnixSocketPath is the usable length of sockaddr_un.sun_path on
	// Linux (108 bytes including the terminating NUL).
	maxUnixSocketPath = 107
)

// PostgresInstallHint tells a developer how to get the PostgreSQL server.
const PostgresInstallHint = "install it with `apt-get install -y postgresql` or run `go tool task setup`"

// PostgresConfig configures a PostgreSQL child process. Only Dir is required.
type PostgresConfig struct {
	// Dir is the cluster's data directory. It is initdb'd on first use and
	// reused afterwards, so a restart keeps all data.
	Dir string
	// Port is the TCP port; 0 picks a free loopback port.
	Port int
	// Database is created if missing; default "feed".
	Database string
	// Durable keeps PostgreSQL's crash-safety settings. When false (tests)
	// fsync, synchronous_commit and full_page_writes are off for speed; a
	// machine crash may then corrupt the cluster, which tests do not care
	// about.
	Durable bool
	// BinDir holds initdb and postgres. Default: the directory of
	// `postgres` in PATH if initdb is beside it, else the highest
	// /usr/lib/postgresql/*/bin.
	BinDir string
}

// Postgres is a running PostgreSQL server child process.
type Postgres struct {
	proc     *child
	port     int
	database string
	dir      string
	log      *slog.Logger
}

// StartPostgres initialises the cluster in cfg.Dir if needed, starts
// postgres listening on 127.0.0.1 only, waits until it accepts connections
// and creates cfg.Database if missing. ctx bounds only the start-up; the
// process runs until Stop.
//
// When the current user is root, initdb and postgres run as the `postgres`
// OS user (PostgreSQL refuses to run as root) and the data directory is
// chowned to it.
func StartPostgres(ctx context.Context, cfg PostgresConfig, log *slog.Logger) (*Postgres, error) {
	dir, err := absDir(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("start postgres: data dir: %w", err)
	}
	cfg.Dir = dir
	if cfg.Database == "" {
		cfg.Database = "feed"
	}
	bins, err := findPostgresBins(cfg.BinDir)
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	owner, err := postgresOwner()
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	if err := prepareDataDir(dir, owner); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	if err := initCluster(ctx, bins, dir, owner, cfg.Durable, log); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}

	p, err := startPostgresOnce(ctx, bins, cfg, owner, log)
	if errors.Is(err, errAddrInUse) && cfg.Port == 0 {
		// Someone took the port we picked before postgres bound it; a
		// second pick is all but certain to succeed.
		log.Info("postgres port taken, retrying with another", "component", "postgres")
		p, err = startPostgresOnce(ctx, bins, cfg, owner, log)
	}
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	if err := p.ensureDatabase(ctx); err != nil {
		_ = p.Stop()
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	log.Info("postgres started", "component", "postgres", "url", p.URL(), "dir", dir, "durable", cfg.Durable, "pid", p.PID())
	return p, nil
}

func startPostgresOnce(ctx context.Context, bins postgresBins, cfg PostgresConfig, owner *osUser, log *slog.Logger) (*Postgres, error) {
	port := cfg.Port
	if port == 0 {
		var err error
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	// The socket lives in the data dir: the packaged default
	// (/var/run/postgresql) may not exist or be writable, and parallel test
	// clusters would fight over it. Paths longer than sun_path cannot be
	// bound at all, so then we go TCP-only rather than fail.
	socketDir := cfg.Dir
	if len(socketDir)+len("/.s.PGSQL.")+len(strconv.Itoa(port)) > maxUnixSocketPath {
		log.Warn("data dir path too long for a unix socket; postgres will listen on TCP only", "component", "postgres", "dir", cfg.Dir)
		socketDir = ""
	}
	args := []string{
		"-D", cfg.Dir,
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=" + loopback,
		"-k", socketDir,
	}
	if !cfg.Durable {
		args = append(args,
			"-c", "fsync=off",
			"-c", "synchronous_commit=off",
			"-c", "full_page_writes=off",
		)
	}
	cmd := exec.Command(bins.postgres, args...)
	owner.apply(cmd)
	proc, err := startChild("postgres", cmd, log)
	if err != nil {
		return nil, err
	}
	p := &Postgres{proc: proc, port: port, database: cfg.Database, dir: cfg.Dir, log: log}
	// The probe also checks that the server answering is ours, not some
	// other cluster that bound the port we picked in the meantime.
	probe := func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, p.AdminURL())
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		var dataDir string
		if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err != nil {
			return err
		}
		if dataDir != cfg.Dir {
			return fmt.Errorf("port %d is served by the cluster in %s, not %s", port, dataDir, cfg.Dir)
		}
		return nil
	}
	if err := proc.waitReady(ctx, postgresReadyTimeout, probe); err != nil {
		_ = proc.stop(syscall.SIGQUIT, 2*time.Second)
		return nil, err
	}
	return p, nil
}

// ensureDatabase creates the configured database unless it exists.
func (p *Postgres) ensureDatabase(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, p.AdminURL())
	if err != nil {
		return fmt.Errorf("connect to create database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", p.database).Scan(&exists); err != nil {
		return fmt.Errorf("check database %q: %w", p.database, err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{p.database}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %q: %w", p.database, err)
	}
	p.log.Info("created database", "component", "postgres", "database", p.database)
	return nil
}

// URL returns the connection URL for the configured database, e.g.
// "postgres://postgres@127.0.0.1:5432/feed?sslmode=disable".
func (p *Postgres) URL() string { return p.urlFor(p.database) }

// AdminURL returns the connection URL for the "postgres" maintenance
// database, for creating and dropping databases.
func (p *Postgres) AdminURL() string { return p.urlFor("postgres") }

func (p *Postgres) urlFor(database string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     net.JoinHostPort(loopback, strconv.Itoa(p.port)),
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Port returns the TCP port the server listens on.
func (p *Postgres) Port() int { return p.port }

// Dir returns the cluster's data directory.
func (p *Postgres) Dir() string { return p.dir }

// PID returns the postmaster's process id (also its process group id).
func (p *Postgres) PID() int { return p.proc.pid() }

// Stop asks for a fast shutdown (SIGINT: roll back open transactions,
// checkpoint, exit), waits up to 15s and then SIGKILLs the process group.
// It is idempotent.
func (p *Postgres) Stop() error {
	return p.proc.stop(syscall.SIGINT, postgresStopGrace)
}

// postgresBins locates the server programs of one PostgreSQL version.
type postgresBins struct {
	initdb   string
	postgres string
}

func findPostgresBins(binDir string) (postgresBins, error) {
	if binDir != "" {
		return binsIn(binDir)
	}
	// PATH first, so a developer's chosen version wins; but only if initdb
	// is next to it, since mixing versions breaks initdb.
	if p, err := exec.LookPath("postgres"); err == nil {
		if b, err := binsIn(filepath.Dir(p)); err == nil {
			return b, nil
		}
	}
	// Debian/Ubuntu keep the server programs out of PATH.
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		return compareVersions(filepath.Base(filepath.Dir(a)), filepath.Base(filepath.Dir(b)))
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		if b, err := binsIn(dirs[i]); err == nil {
			return b, nil
		}
	}
	return postgresBins{}, fmt.Errorf("postgres and initdb not found in PATH or /usr/lib/postgresql/*/bin: %s: %w", PostgresInstallHint, ErrBinaryNotFound)
}

func binsIn(dir string) (postgresBins, error) {
	b := postgresBins{initdb: filepath.Join(dir, "initdb"), postgres: filepath.Join(dir, "postgres")}
	for _, p := range []string{b.initdb, b.postgres} {
		if !isExecutable(p) {
			return postgresBins{}, fmt.Errorf("%s not found: %s: %w", p, PostgresInstallHint, ErrBinaryNotFound)
		}
	}
	return b, nil
}

// compareVersions orders "9.6" < "15" < "16" numerically, not lexically.
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}

// osUser is the account initdb and postgres run as when we are root; nil
// means "as ourselves".
type osUser struct {
	name     string
	uid, gid int
}

// postgresOwner returns the account to run PostgreSQL as: nil unless we are
// root, since initdb and postgres refuse to run as root.
func postgresOwner() (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(postgresOSUser)
	if err != nil {
		return nil, fmt.Errorf("running as root, but postgres refuses to run as root and there is no %q OS user to run it as (%w): %s, or run as a non-root user", postgresOSUser, err, PostgresInstallHint)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, fmt.Errorf("uid of %q: %w", postgresOSUser, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return nil, fmt.Errorf("gid of %q: %w", postgresOSUser, err)
	}
	return &osUser{name: postgresOSUser, uid: uid, gid: gid}, nil
}

// apply makes cmd run as u. The working directory is "/" because our own
// may be unreadable to u (e.g. under /root), which initdb complains about.
func (u *osUser) apply(cmd *exec.Cmd) {
	cmd.Dir = "/"
	if u == nil {
		return
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid)},
	}
}

// chown changes path's owner to u (no-op when u is nil).
func (u *osUser) chown(path string) error {
	if u == nil {
		return nil
	}
	return os.Lchown(path, u.uid, u.gid)
}

// prepareDataDir creates dir (0700, as initdb and postgres require) with
// traversable parents, hands it to owner and checks owner can reach it.
func prepareDataDir(dir string, owner *osUser) error {
	// Parents get 0755 explicitly: MkdirAll(dir, 0700) would make them
	// 0700 too and lock the postgres user out.
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("create data dir parent: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create data dir: %w", err)
	}
	if owner == nil {
		return nil
	}
	if err := checkReachable(dir, owner); err != nil {
		return err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("stat data dir: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) == owner.uid {
		return nil // already handed over on an earlier run
	}
	return chownTree(dir, owner)
}

// checkReachable reports a clear error when some ancestor of dir cannot be
// traversed by owner, instead of letting initdb fail with a bare EACCES.
func checkReachable(dir string, owner *osUser) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if ok {
			perm := fi.Mode().Perm()
			var x bool
			switch {
			case int(st.Uid) == owner.uid:
				x = perm&0o100 != 0
			case int(st.Gid) == owner.gid:
				x = perm&0o010 != 0
			default:
				x = perm&0o001 != 0
			}
			if !x {
				return fmt.Errorf("postgres data dir %s is not reachable by the %q OS user: %s (mode %v, uid %d) is not traversable by it. "+
					"PostgreSQL refuses to run as root, so it runs as %q; put the data outside this tree, e.g. FEED_DATA_DIR=/var/tmp/feed",
					dir, owner.name, p, perm, st.Uid, owner.name)
			}
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

func chownTree(dir string, owner *osUser) error {
	err := filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return owner.chown(path)
	})
	if err != nil {
		return fmt.Errorf("chown data dir to %s: %w", owner.name, err)
	}
	return nil
}

// initCluster runs initdb unless dir already holds a cluster (PG_VERSION).
func initCluster(ctx context.Context, bins postgresBins, dir string, owner *osUser, durable bool, log *slog.Logger) error {
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err == nil {
		return nil
	}
	args := []string{
		"-D", dir,
		// Loopback-only development cluster: trust is what lets every tool
		// connect as "postgres" without a password.
		"--auth=trust",
		"-U", "postgres",
		"--encoding=UTF8",
		// C collation: identical sort order on every machine and no
		// dependence on installed locales.
		"--no-locale",
		"--no-instructions",
	}
	if !durable {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, bins.initdb, args...)
	owner.apply(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("initdb %s: %w\n%s", dir, err, strings.TrimSpace(string(out)))
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		log.Debug(line, "component", "initdb")
	}
	log.Info("initialised postgres cluster", "component", "postgres", "dir", dir)
	return nil
}

// Done is closed once the server's process has exited.
func (p *Postgres) Done() <-chan struct{} { return p.proc.done }

// ExitError describes how the server's process exited, with its last output
// lines; it waits for the exit.
func (p *Postgres) ExitError() error { return p.proc.exitError() }
