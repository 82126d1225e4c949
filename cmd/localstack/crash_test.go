package localstack_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
)

// crashHelperEnv switches TestCrashHelper from a no-op into the body of a
// separate process that starts a server and then dies without cleaning
// up. Its value is "<redis|postgres|nats>:<dir>".
const crashHelperEnv = "LOCALSTACK_CRASH_HELPER"

// TestCrashHelper is not a test on its own: TestChildDiesWhenParentCrashes
// runs the test binary again with only this test selected.
func TestCrashHelper(t *testing.T) {
	kind, dir, ok := strings.Cut(os.Getenv(crashHelperEnv), ":")
	if !ok {
		return
	}
	ctx := context.Background()
	var pid int
	switch kind {
	case "redis":
		r, err := localstack.StartRedis(ctx, localstack.RedisConfig{Dir: dir}, testLogger(t))
		require.NoError(t, err)
		pid = r.PID()
	case "postgres":
		p, err := localstack.StartPostgres(ctx, localstack.PostgresConfig{Dir: dir}, testLogger(t))
		require.NoError(t, err)
		pid = p.PID()
	case "nats":
		n, err := localstack.StartNATSProcess(ctx, []string{os.Args[0], "nats"}, localstack.NATSConfig{Dir: dir}, testLogger(t))
		require.NoError(t, err)
		pid = n.PID()
	default:
		t.Fatalf("unknown helper kind %q", kind)
	}
	require.NoError(t, os.WriteFile(filepath.Join(filepath.Dir(dir), "pid"), []byte(strconv.Itoa(pid)), 0o644))
	// Die the way a crash does: no deferred calls, no cleanups, no Stop.
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

func TestChildDiesWhenParentCrashes(t *testing.T) {
	t.Parallel()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		crashAndCheck(t, "redis", filepath.Join(t.TempDir(), "redis"))
	})
	t.Run("nats", func(t *testing.T) {
		t.Parallel()
		crashAndCheck(t, "nats", filepath.Join(t.TempDir(), "nats"))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		// Reuse a stopped test cluster so the helper need not run initdb.
		// Under root this also proves Pdeathsig survives the switch to the
		// postgres user (it is set after setuid, which would clear it).
		p := localstacktest.PostgresForTest(t)
		require.NoError(t, p.Stop())
		crashAndCheck(t, "postgres", p.Dir())
	})
}

// crashAndCheck runs a helper process that starts a server in dir and is
// then SIGKILLed, and asserts that the server dies with it.
func crashAndCheck(t *testing.T, kind, dir string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashHelperEnv+"="+kind+":"+dir)
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, "helper should be killed; output:\n%s", out)

	b, err := os.ReadFile(filepath.Join(filepath.Dir(dir), "pid"))
	require.NoError(t, err, "helper output:\n%s", out)
	pid, err := strconv.Atoi(string(b))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return processGone(pid) }, 5*time.Second, 20*time.Millisecond,
		"%s %d outlived its crashed parent", kind, pid)
}

// processGone reports whether pid no longer runs. An orphan is reparented
// to init (or a subreaper), which may not reap it at once, so a zombie
// counts as gone.
func processGone(pid int) bool {
	if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// Format: "pid (comm) S ..."; comm may contain spaces, so cut at the
	// last ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}
