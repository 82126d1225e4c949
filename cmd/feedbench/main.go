// Command feedbench is the feed service's end-to-end load benchmark: it
// starts the service (or uses one running on this machine), drives it over
// HTTP with an open-loop workload on a synthetic social graph, and writes a
// report of what it measured.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, "feedbench:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "feedbench:", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

const usage = `feedbench — end-to-end load benchmark of the feed service over HTTP on loopback.

Usage:
  feedbench [--url http://127.0.0.1:PORT] [--feed PATH] [--users 1000] [--followers 100]
            [--big 5] [--big-threshold 500] [--post-rate 500] [--read-rate 500]
            [--cached-read-rate 5000] [--viewers 100] [--warmup 10s] [--duration 60s]
            [--read-duration 20s] [--out bench-out] [--seed 1] [--keep]
            [--cpuprofile] [--trace 5s]

Without --url it starts the service as ` + "`feed dev`" + ` in a process of its own, from
the feed binary beside this program or on PATH (or --feed), on free loopback
ports with a temporary data directory; NATS_URL, REDIS_URL and DATABASE_URL,
when set, are used instead of starting servers, as in dev mode. The other FEED_*
variables, GOGC and GOMAXPROCS are passed on to it. Where they are unset, the
bench gives it the settings its recorded figures were measured with on a
small shared machine, not the service's defaults: GOGC=400, GOMAXPROCS=twice
the CPUs and FEED_DEV_REDIS_REALTIME=1 (decision 56); set them (e.g.
GOGC=100 GOMAXPROCS=<the CPUs> FEED_DEV_REDIS_REALTIME=0) to measure the
defaults. The report's stack line names the settings in force.

With --url it loads a service already running on this machine; tokens are
signed with FEED_JWT_SECRET (or the development secret of feed dev), and the
raw Redis and JetStream limits are measured only on servers named by
REDIS_URL and NATS_URL.

It writes report.md, chart.png and summary.json to --out and prints the
report. Build both binaries with

  go build -o .bin/feed ./cmd/feed && go build -o .bin/feedbench ./cmd/feedbench

or run go tool task loadbench -- FLAGS.

Flags:
`
