package localstack_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/feedproject/feed/cmd/localstack"
)

func TestMain(m *testing.M) {
	// StartNATSProcess runs this binary as `<test binary> nats ...` in the
	// tests: the child serves NATS as `feed nats` does.
	if len(os.Args) > 1 && os.Args[1] == "nats" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := localstack.RunNATS(ctx, os.Args[2:], localstack.NATSConfig{}, os.Stderr, slog.New(slog.NewTextHandler(os.Stderr, nil)))
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "nats:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(localstack.RunTests(m))
}
