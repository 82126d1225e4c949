//go:build !unix

package media

import (
	"fmt"
	"os"
)

// lockDir opens the lock file at path; without flock(2) it does not lock.
func lockDir(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("media packs lock: %w", err)
	}
	return f, nil
}
