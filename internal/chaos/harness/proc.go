package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Bridge builds the bridge binary once per test binary.
var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// BridgeBinary builds ./cmd/bridge into a temporary directory (once) and
// returns its path.
func BridgeBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "chaos-bridge-")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "bridge")
		cmd := exec.Command("go", "build", "-o", buildPath, "./cmd/bridge")
		cmd.Dir = RepoRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/bridge: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

// Exit is one end of a supervised process's run.
type Exit struct {
	At     time.Time
	Killed bool // by the test (SIGKILL)
	Err    error
	Uptime time.Duration
	Tail   string // last log line, for an exit the test did not cause
}

// Proc is a bridge subprocess under a supervisor that restarts it after
// RestartDelay whenever it ends (as systemd's Restart=always would), until
// Stop.
type Proc struct {
	Name         string
	Kind         string // relay, consume, deliver, run
	RestartDelay time.Duration

	bin     string
	args    []string
	env     []string
	logPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	started time.Time
	killing bool
	stopped bool
	exits   []Exit
	pids    []int
	done    chan struct{}
	held    chan struct{} // non-nil: the next restart waits until it is closed (Resume)
}

// NewProc prepares `bin args...` with env (added to a minimal environment);
// its output goes to dir/<name>.log.
func NewProc(bin, dir, name, kind string, env []string, args ...string) *Proc {
	return &Proc{Name: name, Kind: kind, RestartDelay: 500 * time.Millisecond, bin: bin, args: args,
		env: env, logPath: filepath.Join(dir, name+".log"), done: make(chan struct{})}
}

// Start runs the supervisor loop.
func (p *Proc) Start() error {
	if err := p.spawn(); err != nil {
		return err
	}
	go p.supervise()
	return nil
}

func (p *Proc) spawn() error {
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	keepInheritedFDsFromChildren()
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, p.env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	fmt.Fprintf(f, "---- %s start\n", time.Now().Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		return err
	}
	p.mu.Lock()
	p.cmd, p.started = cmd, time.Now()
	p.pids = append(p.pids, cmd.Process.Pid)
	p.mu.Unlock()
	return nil
}

func (p *Proc) supervise() {
	defer close(p.done)
	for {
		p.mu.Lock()
		cmd := p.cmd
		p.mu.Unlock()
		err := cmd.Wait()
		p.mu.Lock()
		x := Exit{At: time.Now(), Killed: p.killing, Err: err, Uptime: time.Since(p.started)}
		if !x.Killed && !p.stopped {
			x.Tail = lastLine(p.LogTail(2000))
		}
		p.exits = append(p.exits, x)
		p.killing = false
		stopped := p.stopped
		p.mu.Unlock()
		if stopped {
			return
		}
		p.mu.Lock()
		held := p.held
		p.mu.Unlock()
		if held != nil {
			<-held
		}
		time.Sleep(p.RestartDelay)
		for {
			p.mu.Lock()
			stopped = p.stopped
			p.mu.Unlock()
			if stopped {
				return
			}
			if err := p.spawn(); err == nil {
				break
			}
			time.Sleep(p.RestartDelay)
		}
	}
}

// Pid is the current process id.
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// Kill SIGKILLs the current process (the supervisor restarts it) and returns
// the pid it killed.
func (p *Proc) Kill() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killing = true
	pid := p.cmd.Process.Pid
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	return pid
}

// KillAndHold SIGKILLs the current process and keeps it down until Resume:
// a node that is gone, not one a supervisor restarts at once.
func (p *Proc) KillAndHold() int {
	p.mu.Lock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
	p.mu.Unlock()
	return p.Kill()
}

// Resume lets a process held by KillAndHold start again.
func (p *Proc) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

// Stop sends SIGTERM, waits up to grace, then SIGKILLs; no restart.
func (p *Proc) Stop(grace time.Duration) {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		<-p.done
		return
	}
	p.stopped = true
	if p.held != nil {
		close(p.held) // a held supervisor sees stopped and returns
		p.held = nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	p.mu.Unlock()
	select {
	case <-p.done:
	case <-time.After(grace):
		p.mu.Lock()
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		p.mu.Unlock()
		<-p.done
	}
}

// Exits returns every end of the process so far.
func (p *Proc) Exits() []Exit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Exit(nil), p.exits...)
}

// Pids returns every pid the process has had.
func (p *Proc) Pids() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.pids...)
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndex(s, "\n"); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// LogTail returns the last bytes of the process's log.
func (p *Proc) LogTail(n int) string {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// keepInheritedFDsFromChildren marks every descriptor this process
// inherited (fd 3 and up) close-on-exec. Go passes a child only stdin,
// stdout and stderr, but a descriptor inherited without close-on-exec — the
// lock of `flock LOCK go test ...` — would stay open in every broker or
// bridge process the harness starts, and a broker that outlives the test
// would hold that lock for good.
func keepInheritedFDsFromChildren() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}
