package localstack

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
)

// loopback is the only address the local servers listen on: development
// dependencies with trust auth must never be reachable from the network.
const loopback = "127.0.0.1"

// ErrBinaryNotFound is returned (wrapped, with install instructions) when a
// server binary needed by the stack is not installed.
var ErrBinaryNotFound = errors.New("binary not found")

// freePort asks the kernel for an unused loopback port. The listener is
// closed before the server binds the port, so another process may grab it
// in between; callers retry once on "address already in use" instead of
// passing sockets to children.
func freePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// FreePorts asks the kernel for n unused loopback ports, all different: each
// listener is held until the last is open, since a port closed at once may be
// handed out again by the next ask. They are closed on return, so a caller
// that binds them later must still expect "address already in use" from
// another process and pick again.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(loopback, "0"))
		if err != nil {
			return nil, fmt.Errorf("pick free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// findBinary returns the first executable among name in PATH and the given
// absolute fallbacks; fallbacks matter because `go test` and IDEs often run
// with a minimal PATH.
func findBinary(name string, fallbacks ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, p := range fallbacks {
		if isExecutable(p) {
			return p, nil
		}
	}
	return "", ErrBinaryNotFound
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode().Perm()&0o111 != 0
}

// absDir makes dir absolute, because children run with a different working
// directory (and, for postgres, as a different user).
func absDir(dir string) (string, error) {
	if dir == "" {
		return "", errors.New("directory is required")
	}
	return filepath.Abs(dir)
}
