//go:build unix

package media

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockDir takes the lock file at path, so that one process at a time
// appends to the packs beside it.
func lockDir(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("media packs lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("media store %s is open in another process (one process at a time may use a media directory)", path)
		}
		return nil, fmt.Errorf("media packs lock: %w", err)
	}
	return f, nil
}
