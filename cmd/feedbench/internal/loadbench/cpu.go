package loadbench

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// cpuTicks is the machine's CPU time from /proc/stat, in clock ticks.
type cpuTicks struct {
	// busy is the time the CPUs ran work (user, nice, system, irq, softirq);
	// kernel the part of it in the kernel (system, irq, softirq).
	busy, kernel uint64
	// steal is the time the hypervisor ran something else while this
	// machine's CPUs had work: not busy, yet not idle either.
	steal uint64
	total uint64
}

// machineCPU reads the machine's CPU time from /proc/stat (Linux): the bench
// and the service share the machine, so how busy it was is part of every
// figure.
func machineCPU() (cpuTicks, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuTicks{}, fmt.Errorf("machine cpu: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return cpuTicks{}, fmt.Errorf("machine cpu: empty /proc/stat: %w", sc.Err())
	}
	return parseCPULine(sc.Text())
}

// parseCPULine reads the aggregate "cpu user nice system idle iowait irq
// softirq steal ..." line; idle and iowait are not busy, nor is steal, which
// is counted apart.
func parseCPULine(line string) (cpuTicks, error) {
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return cpuTicks{}, fmt.Errorf("machine cpu: unexpected line %q", line)
	}
	var t cpuTicks
	for i, f := range fields[1:] {
		if i >= 8 { // guest time is already counted in user
			break
		}
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return cpuTicks{}, fmt.Errorf("machine cpu: %q: %w", line, err)
		}
		t.total += v
		switch i {
		case 3, 4: // idle, iowait
		case 7:
			t.steal += v
		default:
			t.busy += v
		}
		if i == 2 || i == 5 || i == 6 {
			t.kernel += v
		}
	}
	return t, nil
}

// kdamondCPU is the CPU time the kernel's DAMON monitors (its kdamond
// threads) have used, from the proc file system at root: their sampling
// takes the CPU from whatever runs on it. ok is false
// when none runs.
func kdamondCPU(root fs.FS) (d time.Duration, ok bool) {
	entries, err := fs.ReadDir(root, "proc")
	if err != nil {
		return 0, false
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := fs.ReadFile(root, path.Join("proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		p, err := parseStat(string(stat))
		if err != nil || !strings.HasPrefix(p.comm, "kdamond") {
			continue
		}
		d += time.Duration(p.utime+p.stime) * time.Second / clockTicks
		ok = true
	}
	return d, ok
}

// selfCPU is the CPU time the bench's own process has used (its threads,
// not its children: the service it started is measured apart).
func selfCPU() (time.Duration, error) {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, fmt.Errorf("bench cpu: %w", err)
	}
	p, err := parseStat(string(stat))
	if err != nil {
		return 0, fmt.Errorf("bench cpu: %w", err)
	}
	return time.Duration(p.utime+p.stime) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux platform Go supports.
const clockTicks = 100

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
			ticks := p.utime + p.stime + p.cutime + p.cstime
			for _, c := range procs {
				if c.ppid == p.pid {
					ticks += c.utime + c.stime
				}
			}
			return time.Duration(ticks) * time.Second / clockTicks, nil
		}
		return 0, fmt.Errorf("no postgres process listening on port %d found", port)
	}
}

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
	pid, ppid                    int
	comm                         string // the name in /proc/<pid>/stat
	utime, stime, cutime, cstime uint64
	cmdline                      []string
}

func readProcs() ([]proc, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone meanwhile
		}
		p, err := parseStat(string(stat))
		if err != nil || p.pid != pid {
			continue
		}
		if cmd, err := pidCmdline(pid); err == nil {
			p.cmdline = cmd
		}
		out = append(out, p)
	}
	return out, nil
}

// parseStat reads /proc/<pid>/stat: "pid (comm) state ppid …", where comm may
// hold spaces and parentheses, so the fields are counted after the last ')'.
func parseStat(stat string) (proc, error) {
	open, closing := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
	if open < 0 || closing < open {
		return proc{}, fmt.Errorf("process stat %q: no command", stat)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(stat[:open]))
	if err != nil {
		return proc{}, fmt.Errorf("process stat: pid: %w", err)
	}
	// After the command: state(0) ppid(1) … utime(11) stime(12) cutime(13) cstime(14).
	f := strings.Fields(stat[closing+1:])
	if len(f) < 15 {
		return proc{}, fmt.Errorf("process stat %q: too few fields", stat)
	}
	p := proc{pid: pid, comm: stat[open+1 : closing]}
	if p.ppid, err = strconv.Atoi(f[1]); err != nil {
		return proc{}, fmt.Errorf("process stat: ppid: %w", err)
	}
	for i, dst := range []*uint64{&p.utime, &p.stime, &p.cutime, &p.cstime} {
		if *dst, err = strconv.ParseUint(f[11+i], 10, 64); err != nil {
			return proc{}, fmt.Errorf("process stat: times: %w", err)
		}
	}
	return p, nil
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
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("list processes: %w", err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cmd, err := pidCmdline(pid); err == nil && f.match(cmd) {
			f.pid = pid
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no %s found", f.what)
}

// pidCmdline is a process's arguments, from /proc/<pid>/cmdline.
func pidCmdline(pid int) ([]string, error) {
	cmd, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimRight(string(cmd), "\x00"), "\x00"), nil
}

// pidCPU is the CPU time a process has used itself (utime and stime, not its
// reaped children's).
func pidCPU(pid int) (time.Duration, error) {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, fmt.Errorf("process cpu: %w", err)
	}
	p, err := parseStat(string(stat))
	if err != nil {
		return 0, err
	}
	return time.Duration(p.utime+p.stime) * time.Second / clockTicks, nil
}

// pidRSS is a process's resident set size in bytes, from the second field
// of /proc/<pid>/statm (in pages).
func pidRSS(pid int) (int64, error) {
	statm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "statm"))
	if err != nil {
		return 0, fmt.Errorf("process memory: %w", err)
	}
	return parseStatm(string(statm), os.Getpagesize())
}

// parseStatm reads the resident pages of /proc/<pid>/statm ("size resident
// shared text lib data dt", in pages) as bytes.
func parseStatm(statm string, pageSize int) (int64, error) {
	f := strings.Fields(statm)
	if len(f) < 2 {
		return 0, fmt.Errorf("process statm %q: too few fields", statm)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("process statm: resident: %w", err)
	}
	return pages * int64(pageSize), nil
}
