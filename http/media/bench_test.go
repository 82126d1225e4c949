//go:build unix

package media_test

import (
	"bytes"
	"encoding/binary"
	"image"
	"image/png"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/feedproject/feed/http/media"
)

// BenchmarkStores saves small unique images, each with its Sync as a post
// does, from 32 goroutines at once, into a Dir (a file and two fsyncs an
// image) and into a Pack (an append, and an fdatasync shared by the uploads
// that wait together), and reports the process's CPU time an image (user and
// kernel: most of a file's cost is the kernel's) beside the rate:
//
//	go test -run '^$' -bench BenchmarkStores -benchtime 5000x ./http/media
func BenchmarkStores(b *testing.B) {
	stores := []struct {
		name string
		open func(b *testing.B) media.Store
	}{
		{"dir", func(b *testing.B) media.Store {
			d, err := media.NewDir(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			return d
		}},
		{"pack", func(b *testing.B) media.Store {
			p, err := media.NewPack(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = p.Close() })
			return p
		}},
	}
	var base bytes.Buffer
	if err := png.Encode(&base, image.NewGray(image.Rect(0, 0, 24, 24))); err != nil {
		b.Fatal(err)
	}
	var seq atomic.Uint64
	for _, st := range stores {
		b.Run(st.name, func(b *testing.B) {
			s := st.open(b)
			b.SetParallelism(16) // 32 goroutines on 2 cores
			cpu := cpuTime()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					// A unique image: bytes after the PNG's end are kept and hashed
					// but not decoded.
					data := binary.LittleEndian.AppendUint64(bytes.Clone(base.Bytes()), seq.Add(1))
					if _, err := s.Save(b.Context(), bytes.NewReader(data), 5<<20); err != nil {
						b.Error(err)
						return
					}
					if err := s.Sync(b.Context()); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu)/float64(time.Microsecond)/float64(b.N), "cpu-µs/image")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "images/s")
		})
	}
}

// cpuTime is the process's CPU time so far, user and kernel.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
