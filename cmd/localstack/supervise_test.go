package localstack_test

import (
	"context"
	"log/slog"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack"
)

// process is a Process as a supervised server.
type process struct{ *localstack.Process }

func (p process) Stop() error { return p.Process.Stop(time.Second) }

func startProcess(t *testing.T, script string) process {
	t.Helper()
	p, err := localstack.StartProcess("sh", exec.Command("sh", "-c", script), slog.New(slog.DiscardHandler), nil)
	require.NoError(t, err)
	return process{p}
}

// TestSupervisorRestartsAKilledServer: a server killed with SIGKILL is
// started again, and stopped with the supervisor.
func TestSupervisorRestartsAKilledServer(t *testing.T) {
	started := make(chan process, 10)
	first := startProcess(t, "exec sleep 60")
	sup := localstack.Supervise("sleeper", first, func(context.Context) (localstack.Server, error) {
		p := startProcess(t, "exec sleep 60")
		started <- p
		return p, nil
	}, localstack.SupervisorConfig{MinBackoff: 10 * time.Millisecond}, slog.New(slog.DiscardHandler))

	require.NoError(t, syscall.Kill(first.PID(), syscall.SIGKILL))
	var second process
	select {
	case second = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("not restarted")
	}
	assert.NotEqual(t, first.PID(), second.PID())

	// sleep dies of the SIGTERM, which Stop reports.
	require.ErrorContains(t, sup.Stop(), "signal: terminated")
	select {
	case <-second.Done():
	default:
		t.Fatal("the restarted server still runs after Stop")
	}
	select {
	case err := <-sup.Failed():
		t.Fatalf("gave up: %v", err)
	default:
	}
}

// TestSupervisorGivesUpAfterRepeatedFailures: a server that dies at once
// each time is tried MaxFailures times within the window, and then the
// supervisor says why it gave up.
func TestSupervisorGivesUpAfterRepeatedFailures(t *testing.T) {
	starts := 0
	sup := localstack.Supervise("crasher", startProcess(t, "echo out of cheese; exit 3"), func(context.Context) (localstack.Server, error) {
		starts++
		return startProcess(t, "echo out of cheese; exit 3"), nil
	}, localstack.SupervisorConfig{MinBackoff: time.Millisecond, MaxFailures: 4}, slog.New(slog.DiscardHandler))
	defer sup.Stop() //nolint:errcheck // the last process failed, as intended

	select {
	case err := <-sup.Failed():
		assert.ErrorContains(t, err, "crasher failed 4 times within 1m0s; giving up")
		assert.ErrorContains(t, err, "out of cheese")
	case <-time.After(20 * time.Second):
		t.Fatal("did not give up")
	}
	assert.Equal(t, 3, starts)
}
