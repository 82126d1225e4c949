package loadbench

import (
	"fmt"
	"io/fs"
	"path"
	"strings"
	"time"
)

// damonRoot is where Linux lists its DAMON monitors (kdamonds), relative to
// the root of the file system.
const damonRoot = "sys/kernel/mm/damon/admin/kdamonds"

// damonNotes describes the DAMON monitors running on the machine (root is
// its file system, os.DirFS("/")). A monitor of the physical address space
// samples its pages' accessed bits every sample interval, walking the page
// tables of the processes that map them, and can page cold memory out: on
// a machine where one sampled every 500 ms it took the CPU from the service's
// threads for tens of milliseconds at a time, so a report says whether its
// figures were measured beside one. None when
// DAMON is absent or every monitor is off.
func damonNotes(root fs.FS) []string {
	dirs, err := fs.ReadDir(root, damonRoot)
	if err != nil {
		return nil
	}
	var notes []string
	for _, d := range dirs {
		base := path.Join(damonRoot, d.Name())
		if !d.IsDir() || readTrimmed(root, path.Join(base, "state")) != "on" {
			continue
		}
		ctx := path.Join(base, "contexts", "0")
		note := fmt.Sprintf("DAMON monitor %s is on", d.Name())
		if ops := readTrimmed(root, path.Join(ctx, "operations")); ops != "" {
			note += fmt.Sprintf(" (operations %s", ops)
			var us int64
			if _, err := fmt.Sscan(readTrimmed(root, path.Join(ctx, "monitoring_attrs", "intervals", "sample_us")), &us); err == nil && us > 0 {
				note += fmt.Sprintf(", sampling every %s", time.Duration(us)*time.Microsecond)
			}
			var actions []string
			schemes, _ := fs.ReadDir(root, path.Join(ctx, "schemes"))
			for _, s := range schemes {
				if a := readTrimmed(root, path.Join(ctx, "schemes", s.Name(), "action")); s.IsDir() && a != "" {
					actions = append(actions, a)
				}
			}
			if len(actions) > 0 {
				note += ", schemes " + strings.Join(actions, ", ")
			}
			note += ")"
		}
		notes = append(notes, note)
	}
	return notes
}

func readTrimmed(root fs.FS, name string) string {
	b, err := fs.ReadFile(root, name)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
