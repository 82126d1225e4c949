package loadbench

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"
)

// cpuTimes is the machine's CPU time since boot, from /proc/stat.
type cpuTimes struct {
	// busy is the time the CPUs ran work (user, nice, system, irq, softirq);
	// kernel the part of it in the kernel (system, irq, softirq).
	busy, kernel time.Duration
	// steal is the time the hypervisor ran something else while this
	// machine's CPUs had work: not busy, yet not idle either.
	steal time.Duration
	total time.Duration
}

// machineCPU reads the machine's CPU time (Linux): the bench and the service
// share the machine, so how busy it was is part of every figure.
func machineCPU() (cpuTimes, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return cpuTimes{}, fmt.Errorf("machine cpu: %w", err)
	}
	st, err := fs.Stat()
	if err != nil {
		return cpuTimes{}, fmt.Errorf("machine cpu: %w", err)
	}
	return cpuTimesOf(st.CPUTotal), nil
}

// cpuTimesOf sorts the aggregate CPU times: idle and iowait are not busy,
// nor is steal, which is counted apart; guest time is in user already.
func cpuTimesOf(c procfs.CPUStat) cpuTimes {
	d := func(secs ...float64) time.Duration {
		var sum float64
		for _, s := range secs {
			sum += s
		}
		return time.Duration(sum * float64(time.Second))
	}
	return cpuTimes{
		busy:   d(c.User, c.Nice, c.System, c.IRQ, c.SoftIRQ),
		kernel: d(c.System, c.IRQ, c.SoftIRQ),
		steal:  d(c.Steal),
		total:  d(c.User, c.Nice, c.System, c.Idle, c.Iowait, c.IRQ, c.SoftIRQ, c.Steal),
	}
}

// kdamondCPU is the CPU time the kernel's DAMON monitors (its kdamond
// threads) have used, from the proc file system fs: their sampling takes the
// CPU from whatever runs on it. ok is false when none runs.
func kdamondCPU(fs procfs.FS) (d time.Duration, ok bool) {
	procs, err := fs.AllProcs()
	if err != nil {
		return 0, false
	}
	for _, p := range procs {
		st, err := p.Stat()
		if err != nil || !strings.HasPrefix(st.Comm, "kdamond") {
			continue // gone meanwhile, or another
		}
		d += seconds(st.CPUTime())
		ok = true
	}
	return d, ok
}

// selfCPU is the CPU time the bench's own process has used (its threads,
// not its children: the service it started is measured apart).
func selfCPU() (time.Duration, error) {
	p, err := procfs.Self()
	if err != nil {
		return 0, fmt.Errorf("bench cpu: %w", err)
	}
	st, err := p.Stat()
	if err != nil {
		return 0, fmt.Errorf("bench cpu: %w", err)
	}
	return seconds(st.CPUTime()), nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// PostgresCPU returns a probe of the CPU time used by the local Postgres
// server listening on port (started with -p port, as this project starts
// it): its postmaster, its live backends and the backends it has reaped.
func PostgresCPU(port int) func(context.Context) (time.Duration, error) {
	return func(context.Context) (time.Duration, error) {
		procs, err := readProcs()
		if err != nil {
			return 0, err
		}
		want := strconv.Itoa(port)
		for _, p := range procs {
			if !isPostmaster(p.cmdline, want) {
				continue
			}
			// Reaped children's times are in ticks of USER_HZ, as CPUTime's.
			cpu := seconds(p.stat.CPUTime() + float64(p.stat.CUTime+p.stat.CSTime)/userHZ)
			for _, c := range procs {
				if c.stat.PPID == p.stat.PID {
					cpu += seconds(c.stat.CPUTime())
				}
			}
			return cpu, nil
		}
		return 0, fmt.Errorf("no postgres process listening on port %d found", port)
	}
}

// userHZ is the unit of /proc/<pid>/stat times: 100 on every Linux platform
// Go supports.
const userHZ = 100

func isPostmaster(cmdline []string, port string) bool {
	if len(cmdline) == 0 || filepath.Base(cmdline[0]) != "postgres" {
		return false
	}
	for i := 1; i+1 < len(cmdline); i++ {
		if cmdline[i] == "-p" && cmdline[i+1] == port {
			return true
		}
	}
	return false
}

// proc is what the bench reads of one process.
type proc struct {
	stat    procfs.ProcStat
	cmdline []string
}

func readProcs() ([]proc, error) {
	all, err := procfs.AllProcs()
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	out := make([]proc, 0, len(all))
	for _, p := range all {
		st, err := p.Stat()
		if err != nil {
			continue // gone meanwhile
		}
		cmd, _ := p.CmdLine()
		out = append(out, proc{stat: st, cmdline: cmd})
	}
	return out, nil
}

// NATSProcess returns probes of the local NATS server listening on port that
// this project starts as a child of the service (`feed nats --dir DIR --port
// PORT`, see localstack.StartNATSProcess): the CPU time it has used (it has
// no children) and its resident set size in bytes. They fail while no such
// process runs, e.g. when the service uses an external NATS_URL. The process
// is looked for in /proc once, then checked again by its command line at
// every call.
func NATSProcess(port int) (cpu func(context.Context) (time.Duration, error), memory func(context.Context) (int64, error)) {
	f := &procFinder{
		what:  fmt.Sprintf("nats process listening on port %d", port),
		match: func(cmdline []string) bool { return isNATSServer(cmdline, strconv.Itoa(port)) },
	}
	cpu = func(context.Context) (time.Duration, error) {
		pid, err := f.find()
		if err != nil {
			return 0, err
		}
		return pidCPU(pid)
	}
	memory = func(context.Context) (int64, error) {
		pid, err := f.find()
		if err != nil {
			return 0, err
		}
		return pidRSS(pid)
	}
	return cpu, memory
}

// isNATSServer tells whether cmdline is `… nats … --port port …`: an argument
// "nats" (the subcommand, not the program) and later "--port" followed by
// port.
func isNATSServer(cmdline []string, port string) bool {
	sub := slices.Index(cmdline[min(1, len(cmdline)):], "nats")
	if sub < 0 {
		return false
	}
	for i := sub + 2; i+1 < len(cmdline); i++ {
		if cmdline[i] == "--port" && cmdline[i+1] == port {
			return true
		}
	}
	return false
}

// procFinder finds a process by its command line and remembers its id.
type procFinder struct {
	what  string
	match func(cmdline []string) bool
	mu    sync.Mutex
	pid   int
}

func (f *procFinder) find() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pid > 0 {
		// Still the same process (not gone, its id not reused)?
		if cmd, err := pidCmdline(f.pid); err == nil && f.match(cmd) {
			return f.pid, nil
		}
		f.pid = 0
	}
	procs, err := procfs.AllProcs()
	if err != nil {
		return 0, fmt.Errorf("list processes: %w", err)
	}
	for _, p := range procs {
		if cmd, err := p.CmdLine(); err == nil && f.match(cmd) {
			f.pid = p.PID
			return p.PID, nil
		}
	}
	return 0, fmt.Errorf("no %s found", f.what)
}

// pidCmdline is a process's arguments.
func pidCmdline(pid int) ([]string, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return nil, err
	}
	return p.CmdLine()
}

// pidStat is a process's /proc/<pid>/stat.
func pidStat(pid int) (procfs.ProcStat, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return procfs.ProcStat{}, err
	}
	return p.Stat()
}

// pidCPU is the CPU time a process has used itself (utime and stime, not its
// reaped children's).
func pidCPU(pid int) (time.Duration, error) {
	st, err := pidStat(pid)
	if err != nil {
		return 0, fmt.Errorf("process cpu: %w", err)
	}
	return seconds(st.CPUTime()), nil
}

// pidRSS is a process's resident set size in bytes.
func pidRSS(pid int) (int64, error) {
	st, err := pidStat(pid)
	if err != nil {
		return 0, fmt.Errorf("process memory: %w", err)
	}
	return int64(st.ResidentMemory()), nil
}
