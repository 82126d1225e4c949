package media

import (
	"os"
	"syscall"
)

// datasync writes f's data, and what of its metadata reading it back needs
// (its size), to the disk: fdatasync(2).
func datasync(f *os.File) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	return serr
}
