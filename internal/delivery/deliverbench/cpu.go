package deliverbench

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat (USER_HZ,
// 100 on Linux).
const clockTick = 10 * time.Millisecond

// postgresCPU sums the CPU time of this machine's PostgreSQL backends
// serving database db, read from /proc: on a shared machine the drain rate
// says how much of the CPU the run got, the CPU spent per delivery says how
// much work each one took. ok is false where /proc is not readable (another
// OS, PostgreSQL elsewhere).
func postgresCPU(db string) (total time.Duration, ok bool) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return 0, false
	}
	for _, dir := range dirs {
		cmd, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		// A backend's title is "postgres: user database host(port) state".
		if err != nil || !strings.HasPrefix(string(cmd), "postgres: ") ||
			!strings.Contains(string(cmd), " "+db+" ") {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(dir, "stat"))
		if err != nil {
			continue
		}
		// Fields after the parenthesised command: state is field 3,
		// utime 14, stime 15.
		rest := string(stat)
		if i := strings.LastIndexByte(rest, ')'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(u+s) * clockTick
		ok = true
	}
	return total, ok
}

// selfCPU is this process's CPU time: the deliverers, the receiver and the
// bench itself.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
