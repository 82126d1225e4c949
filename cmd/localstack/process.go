package localstack

import (
	"io"
	"log/slog"
	"os/exec"
	"syscall"
	"time"
)

// Process is a program run as a supervised child, as Redis and Postgres are:
// in its own process group, killed by the kernel if this process dies, its
// output logged line by line at debug level (the last lines are kept for the
// error of an unexpected exit).
type Process struct{ c *child }

// StartProcess starts cmd, whose Stdout and Stderr it replaces; each line of
// its output is also written to echo, if not nil.
func StartProcess(name string, cmd *exec.Cmd, log *slog.Logger, echo io.Writer) (*Process, error) {
	c, err := startChildEcho(name, cmd, log, echo)
	if err != nil {
		return nil, err
	}
	return &Process{c}, nil
}

// PID is the process id.
func (p *Process) PID() int { return p.c.pid() }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.c.done }

// ExitError describes how the process exited, with its last output lines; it
// waits for the exit.
func (p *Process) ExitError() error { return p.c.exitError() }

// Stop sends SIGTERM, waits up to grace for the process to exit and then kills
// its process group. An exit other than a clean one is returned.
func (p *Process) Stop(grace time.Duration) error { return p.c.stop(syscall.SIGTERM, grace) }
