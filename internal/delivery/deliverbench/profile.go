package deliverbench

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
)

// profiler records what this process spends during the drain (see
// Options.Profile): the CPU profile from start to stop and the allocation
// profile at both ends.
type profiler struct {
	prefix string
	cpu    *os.File
}

func startProfile(prefix string) (*profiler, error) {
	if prefix == "" {
		return &profiler{}, nil
	}
	if err := writeAllocs(prefix + ".allocs.base"); err != nil {
		return nil, err
	}
	f, err := os.Create(prefix + ".cpu")
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return &profiler{prefix: prefix, cpu: f}, nil
}

// stop ends the CPU profile and writes the allocations; safe to call twice.
func (p *profiler) stop() error {
	if p == nil || p.cpu == nil {
		return nil
	}
	pprof.StopCPUProfile()
	err := p.cpu.Close()
	p.cpu = nil
	if aerr := writeAllocs(p.prefix + ".allocs"); err == nil {
		err = aerr
	}
	return err
}

func writeAllocs(path string) error {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("allocs profile: %w", err)
	}
	defer f.Close()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		return fmt.Errorf("allocs profile %s: %w", path, err)
	}
	return nil
}
