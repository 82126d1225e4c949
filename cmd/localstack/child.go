package localstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// outputTailLines is how many of a child's last output lines are kept so a
// failed start can say why (e.g. "Address already in use") without the
// caller having to enable debug logging and retry.
const outputTailLines = 30

// child is a supervised local server process (redis-server, postgres).
type child struct {
	name string // component name used in logs and errors
	cmd  *exec.Cmd
	out  *lineLogger
	log  *slog.Logger

	done    chan struct{} // closed once the process has been reaped
	waitErr error         // result of cmd.Wait; read only after done is closed

	stopOnce sync.Once
	stopErr  error
}

// startChild starts cmd as a child process that lives until stop is called.
//
// The child gets its own process group so a Ctrl-C in the developer's
// terminal reaches only us (and we shut it down in order) rather than
// racing us to kill the database. Pdeathsig SIGKILL makes the kernel kill
// it if we crash, so no orphaned servers hold ports after a panic.
//
// Pdeathsig fires when the OS thread that forked the child exits, not when
// the process exits, and the Go runtime destroys threads whose goroutine
// exits while locked with runtime.LockOSThread. So the fork and the Wait
// both happen on one goroutine locked to its thread for the child's whole
// life: that thread cannot be handed to someone else's locked goroutine
// and torn down under the child.
func startChild(name string, cmd *exec.Cmd, log *slog.Logger) (*child, error) {
	return startChildEcho(name, cmd, log, nil)
}

// startChildEcho is startChild that also writes each line of the child's
// output to echo, if not nil.
func startChildEcho(name string, cmd *exec.Cmd, log *slog.Logger, echo io.Writer) (*child, error) {
	return startChildLeveled(name, cmd, log, echo, nil)
}

// startChildLeveled is startChildEcho that logs each line of output as the
// record that record makes of it (the line at debug when record is nil).
func startChildLeveled(name string, cmd *exec.Cmd, log *slog.Logger, echo io.Writer, record func(line string) (slog.Level, string, []any)) (*child, error) {
	c := &child{
		name: name,
		cmd:  cmd,
		out:  &lineLogger{log: log, component: name, echo: echo, record: record},
		log:  log,
		done: make(chan struct{}),
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	// Same writer for both streams: exec then uses a single pipe and one
	// copying goroutine, so lines from stdout and stderr never interleave
	// mid-line.
	cmd.Stdout = c.out
	cmd.Stderr = c.out
	// Postgres backends inherit the output pipe; if one outlives the
	// postmaster briefly, Wait must not block on it forever.
	cmd.WaitDelay = 3 * time.Second

	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(c.done)
			return
		}
		started <- nil
		c.waitErr = cmd.Wait()
		c.out.flush()
		close(c.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	log.Debug("child started", "component", name, "pid", cmd.Process.Pid, "cmd", strings.Join(cmd.Args, " "))
	return c, nil
}

// pid returns the child's process id (also its process group id).
func (c *child) pid() int { return c.cmd.Process.Pid }

// exited reports whether the child has already been reaped.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// exitError describes an unexpected exit, including the last output lines,
// which almost always contain the server's own explanation.
func (c *child) exitError() error {
	<-c.done
	tail := c.out.tail()
	if tail == "" {
		return fmt.Errorf("%s exited: %v", c.name, c.waitErr)
	}
	return fmt.Errorf("%s exited: %v; last output:\n%s", c.name, c.waitErr, tail)
}

// stop sends sig to the child, waits up to grace for it to exit and then
// SIGKILLs its whole process group (so postgres backends go too). It is
// idempotent; later calls return the first call's result.
func (c *child) stop(sig syscall.Signal, grace time.Duration) error {
	c.stopOnce.Do(func() {
		if c.exited() {
			// It died on its own earlier; report that rather than pretend a
			// clean stop. What it started may live on (postgres backends,
			// which would keep its shared memory from a restart).
			_ = syscall.Kill(-c.pid(), syscall.SIGKILL)
			if c.waitErr != nil {
				c.stopErr = c.exitError()
			}
			return
		}
		if err := c.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
			c.log.Warn("signal child", "component", c.name, "signal", sig, "err", err)
		}
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-c.done:
			// A server that handled the signal exits 0; anything else is
			// worth reporting (but it is gone either way).
			if c.waitErr != nil {
				c.stopErr = fmt.Errorf("stop %s: %w", c.name, c.waitErr)
			}
		case <-timer.C:
			c.log.Warn("child did not stop in time, killing", "component", c.name, "pid", c.pid(), "grace", grace)
			_ = syscall.Kill(-c.pid(), syscall.SIGKILL)
			<-c.done
			c.stopErr = fmt.Errorf("stop %s: did not exit within %s after %s, killed", c.name, grace, sig)
		}
		// Sweep stragglers in the group (e.g. a postgres backend that has not
		// yet noticed the postmaster is gone); ESRCH just means none are left.
		_ = syscall.Kill(-c.pid(), syscall.SIGKILL)
		c.log.Info(c.name+" stopped", "component", c.name, "pid", c.pid())
	})
	return c.stopErr
}

// waitReady polls probe until it succeeds, the child exits, ctx ends or
// timeout passes. It returns errAddrInUse-wrapped errors when the child's
// output says its port was taken, so callers that picked the port can retry.
func (c *child) waitReady(ctx context.Context, timeout time.Duration, probe func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	exited := func() error {
		err := c.exitError()
		if c.out.contains("Address already in use") {
			return fmt.Errorf("%w: %w", errAddrInUse, err)
		}
		return err
	}
	for {
		// A probe may hang until its timeout (another program holds the
		// port and never answers): a child that exits meanwhile fails the
		// wait at once.
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		res := make(chan error, 1)
		go func() { res <- probe(pctx) }()
		var err error
		select {
		case err = <-res:
		case <-c.done:
			pcancel()
			return exited()
		}
		pcancel()
		if err == nil {
			return nil
		}
		lastErr = err
		select {
		case <-c.done:
			return exited()
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w (last probe error: %v)", c.name, timeout, ctx.Err(), lastErr)
		case <-tick.C:
		}
	}
}

// errAddrInUse marks a start failure caused by the chosen port being taken
// between picking it and the server binding it.
var errAddrInUse = errors.New("address already in use")

// lineLogger turns a child's output stream into one debug log record per
// line (and a copy to echo, if set) and remembers the last few lines for error
// messages.
type lineLogger struct {
	log       *slog.Logger
	component string
	echo      io.Writer
	// record, if set, makes a line into the record logged: its level,
	// message and attributes; else the line is the message, at debug.
	record func(line string) (slog.Level, string, []any)

	mu      sync.Mutex
	partial []byte
	last    []string // ring of the most recent lines, oldest first
}

// Write implements io.Writer.
func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.emit(string(bytes.TrimRight(l.partial[:i], "\r")))
		l.partial = l.partial[i+1:]
	}
	return len(p), nil
}

// flush emits a trailing line that had no newline.
func (l *lineLogger) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.partial) > 0 {
		l.emit(string(l.partial))
		l.partial = nil
	}
}

func (l *lineLogger) emit(line string) {
	if strings.TrimSpace(line) == "" {
		return
	}
	lvl, msg, attrs := slog.LevelDebug, line, []any(nil)
	if l.record != nil {
		lvl, msg, attrs = l.record(line)
	}
	l.log.Log(context.Background(), lvl, msg, append(attrs, "component", l.component)...)
	if l.echo != nil {
		_, _ = io.WriteString(l.echo, line+"\n")
	}
	if len(l.last) == outputTailLines {
		l.last = append(l.last[:0], l.last[1:]...)
	}
	l.last = append(l.last, line)
}

func (l *lineLogger) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.last, "\n")
}

// contains reports whether the last lines contain s, in any case: Redis says
// "Address already in use", Go programs "address already in use".
func (l *lineLogger) contains(s string) bool {
	return strings.Contains(strings.ToLower(l.tail()), strings.ToLower(s))
}
