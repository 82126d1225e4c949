// Command feed is the news-feed service: one binary whose subcommands serve the
// API and projectors, run the whole stack locally for development, and operate it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/feedproject/feed/cmd/internal/stack"
	"github.com/feedproject/feed/cmd/localstack"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "feed:", err)
		}
		os.Exit(exitCode(err))
	}
}

func exitCode(err error) int {
	if errors.Is(err, errUsage) || errors.Is(err, flag.ErrHelp) {
		return 2
	}
	return 1
}

var errUsage = errors.New("usage")

const usage = `feed — an event-sourced news feed on NATS JetStream, Redis and Postgres.

Usage:
  feed serve   run the API (and, as they are configured, projectors) against
               NATS_URL (feed nats as a child process when unset), REDIS_URL
               and DATABASE_URL
  feed dev     like serve, but start Redis and Postgres as child processes
               under FEED_DATA_DIR when their URLs are unset
  feed dev --cluster
               like dev, but with a three-node JetStream cluster, a Redis
               Cluster of 3 masters and 3 replicas, and Postgres on loopback
               (data under FEED_DATA_DIR/cluster), streams on three nodes and
               images in the object store; prints the settings that point
               more processes at them
  feed nats [--dir DIR] [--port 4222] [--sync always]
               run only the NATS JetStream server that serve and dev start as a
               process of their own when NATS_URL is unset (store under
               FEED_DATA_DIR/nats)
  feed token --user ID [--admin] [--ttl 24h]
               print a bearer token for a user, signed with FEED_JWT_SECRET
               (or the development secret that feed dev accepts)
  feed tail [--since 1h | --from SEQ | --new] [--until T] [--type T] [--user ID]
            [--subject 'ev.*.follow.>'] [--limit N]
               print matching events of the log as JSON lines
  feed status [--json] [--interval 1s]
               projector positions, lag, rate, dead letters and fan-out backlog
  feed replay readmodel|feeds|all [--fresh] [--from SEQ | --since 24h] [--batch N] [--quiet]
               rebuild projectors by replaying the log into a shadow beside the
               live state, then switch to it; Ctrl-C leaves it to resume
  feed help    this text

Configuration is read from the environment; see the README.
`

// run is the whole program behind main, callable from tests.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("%w: no subcommand", errUsage)
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve", "dev":
		fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
		fs.SetOutput(stderr)
		roles := fs.String("roles", "", "comma-separated roles to run (overrides FEED_ROLES)")
		cluster := new(bool)
		if cmd == "dev" {
			fs.BoolVar(cluster, "cluster", false, "run a JetStream cluster, a Redis Cluster and Postgres on loopback, and serve against them")
		}
		if err := fs.Parse(rest); err != nil {
			return err
		}
		env := getenv
		if *cluster {
			env = devClusterEnv(getenv)
		}
		if *roles != "" {
			base := env
			env = func(k string) string {
				if k == "FEED_ROLES" {
					return *roles
				}
				return base(k)
			}
		}
		cfg, err := stack.Parse(env)
		if err != nil {
			return err
		}
		logger := newLogger(cfg, stderr)
		logRedisThrough(logger)
		if *cluster {
			return devCluster(ctx, cfg, logger, stdout)
		}
		return serve(ctx, cfg, cmd == "dev", logger, stdout)
	case "nats":
		cfg, err := stack.Parse(getenv)
		if err != nil {
			return err
		}
		return localstack.RunNATS(ctx, rest, natsConfig(cfg), stderr, newLogger(cfg, stderr))
	case "tail":
		return tail(ctx, rest, getenv, stdout, stderr)
	case "replay", "rebuild":
		return replay(ctx, rest, getenv, stdout, stderr)
	case "status":
		return status(ctx, rest, getenv, stdout, stderr)
	case "token":
		return token(rest, getenv, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("%w: unknown subcommand %q", errUsage, cmd)
	}
}

func newLogger(cfg stack.Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
