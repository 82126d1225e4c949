//go:build !linux

package media

import "os"

// datasync writes f to the disk (fsync(2) where fdatasync(2) is not in
// package syscall).
func datasync(f *os.File) error { return f.Sync() }
